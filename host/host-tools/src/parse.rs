//! The model's text → plain text and tool calls, as the text streams in.
//!
//! Text is released as soon as it cannot be the start of a call marker, so
//! an answer without calls streams without delay. A call is released whole,
//! when its end is seen. Text that looked like a call but is not one comes
//! back as text: nothing the model wrote is lost.

use crate::call_id::new_call_id;
use crate::decode::decode;
use crate::decoded::Decoded;
use crate::json_scan::{JsonEnd, Scan};
use crate::request::Tool;
use crate::syntax::ToolSyntax;
use serde_json::Value;

/// What the parser releases, in output order.
#[derive(Debug, Clone, PartialEq)]
pub enum ParsedEvent {
    Text(String),
    Call {
        /// 0, 1, 2, ... in the order the calls appear in the answer.
        index: usize,
        id: String,
        name: String,
        /// A JSON object as text, as OpenAI sends arguments.
        arguments: String,
    },
}

/// A call found by [`parse_complete`].
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub index: usize,
    pub id: String,
    pub name: String,
    pub arguments: String,
}

/// Parses a whole answer: its text (the pieces outside calls, joined) and its calls.
pub fn parse_complete(syntax: ToolSyntax, text: &str, tools: &[Tool]) -> (String, Vec<Call>) {
    let mut parser = ToolCallParser::new(syntax).with_tools(tools);
    let mut events = parser.push(text);
    events.extend(parser.finish());
    let mut content = String::new();
    let mut calls = Vec::new();
    for e in events {
        match e {
            ParsedEvent::Text(t) => content.push_str(&t),
            ParsedEvent::Call { index, id, name, arguments } => calls.push(Call { index, id, name, arguments }),
        }
    }
    (content, calls)
}

/// How a call opens and closes in one syntax.
struct Opener {
    marker: &'static str,
    /// Opens a call only at a boundary (see `ToolCallParser::boundary`):
    /// a bare `{` in the middle of prose is not a call.
    at_boundary_only: bool,
    /// The marker is part of the call's text (`{`, `<function=`).
    in_body: bool,
    close: Close,
}

#[derive(Clone, Copy)]
enum Close {
    Marker(&'static str),
    /// The call ends with its JSON value.
    JsonValue,
    /// `NAME[ARGS]{...}` or a JSON array: the call ends with the JSON.
    ToolCallsHeader,
}

const fn opener(marker: &'static str, close: Close) -> Opener {
    Opener { marker, at_boundary_only: false, in_body: false, close }
}

const JSON_OBJECT: Opener = Opener { marker: "{", at_boundary_only: true, in_body: true, close: Close::JsonValue };
const JSON_ARRAY: Opener = Opener { marker: "[", at_boundary_only: true, in_body: true, close: Close::JsonValue };
const HERMES: [Opener; 1] = [opener("<tool_call>", Close::Marker("</tool_call>"))];
const QWEN_XML: [Opener; 2] = [
    opener("<tool_call>", Close::Marker("</tool_call>")),
    // Qwen3-Coder at times leaves out <tool_call> and starts at <function=.
    Opener { marker: "<function=", at_boundary_only: false, in_body: true, close: Close::Marker("</function>") },
];
const PYTHON_TAG: [Opener; 2] = [opener("<|python_tag|>", Close::JsonValue), JSON_OBJECT];
const TOOL_CALLS: [Opener; 1] = [opener("[TOOL_CALLS]", Close::ToolCallsHeader)];
const PIPE_TOOL_CALL: [Opener; 1] = [opener("<|tool_call>", Close::Marker("<tool_call|>"))];
const FUNCTION_GEMMA: [Opener; 1] = [opener("<start_function_call>", Close::Marker("<end_function_call>"))];
const JSON: [Opener; 2] = [JSON_OBJECT, JSON_ARRAY];

fn openers(syntax: ToolSyntax) -> &'static [Opener] {
    match syntax {
        ToolSyntax::Json => &JSON,
        ToolSyntax::Hermes => &HERMES,
        ToolSyntax::XmlFunction => &QWEN_XML,
        ToolSyntax::PythonTagJson => &PYTHON_TAG,
        ToolSyntax::ToolCallsList | ToolSyntax::ToolCallsArgs => &TOOL_CALLS,
        ToolSyntax::PipeToolCall => &PIPE_TOOL_CALL,
        ToolSyntax::FunctionCallTags => &FUNCTION_GEMMA,
    }
}

/// A call whose end has not been seen yet.
struct OpenCall {
    opener: &'static Opener,
    /// Separators dropped before the marker; they come back if this turns
    /// out not to be a call.
    lead: String,
    body: String,
    /// How much of `body` has been looked at for the end.
    scanned: usize,
    /// Where the JSON value starts in `body` once known, and its scanner.
    json: Option<(usize, JsonEnd)>,
}

enum Progress {
    Open,
    /// The call's text is `body[..text_end]`; what follows `rest_from` is
    /// ordinary output again.
    Closed {
        text_end: usize,
        rest_from: usize,
    },
    NotACall,
}

/// Streaming parser for one answer. Feed it the text as it is generated
/// ([`push`](Self::push)) and call [`finish`](Self::finish) at the end.
pub struct ToolCallParser {
    syntax: ToolSyntax,
    tools: Vec<Tool>,
    /// Text not released yet: it may still turn out to be a marker.
    held: String,
    call: Option<OpenCall>,
    /// Nothing but separators since the answer began or the last call
    /// ended. Separators here are held back, and dropped when a call or the
    /// end follows: they frame calls rather than say anything.
    boundary: bool,
    after_call: bool,
    next_index: usize,
}

impl ToolCallParser {
    pub fn new(syntax: ToolSyntax) -> Self {
        Self {
            syntax,
            tools: Vec::new(),
            held: String::new(),
            call: None,
            boundary: true,
            after_call: false,
            next_index: 0,
        }
    }

    /// The request's tools: their schemas type the values of syntaxes that
    /// write them as plain text (Qwen's XML).
    pub fn with_tools(mut self, tools: &[Tool]) -> Self {
        self.tools = tools.to_vec();
        self
    }

    /// Takes the next piece of generated text.
    pub fn push(&mut self, delta: &str) -> Vec<ParsedEvent> {
        let mut out = Vec::new();
        let mut input = std::mem::take(&mut self.held);
        input.push_str(delta);
        self.run(input, &mut out);
        out
    }

    /// Ends the answer: releases held text, and a call cut short whose text
    /// is nonetheless complete (the end marker missing or partly written).
    pub fn finish(mut self) -> Vec<ParsedEvent> {
        let mut out = Vec::new();
        if let Some(call) = self.call.take() {
            let marker = if call.opener.in_body { "" } else { call.opener.marker };
            let text = match call.opener.close {
                Close::Marker(end) => &call.body[..call.body.len() - partial_suffix(&call.body, &[end])],
                // A JSON value that closed would have ended the call already.
                Close::JsonValue | Close::ToolCallsHeader => "",
            };
            match (!text.is_empty()).then(|| decode(self.syntax, text, &self.tools)).flatten() {
                Some(calls) => self.release_calls(calls, &mut out),
                None => emit(&mut out, format!("{}{marker}{}", call.lead, call.body)),
            }
        }
        let held = std::mem::take(&mut self.held);
        if !(self.boundary && self.is_separators(&held)) {
            emit(&mut out, held);
        }
        out
    }

    fn run(&mut self, mut input: String, out: &mut Vec<ParsedEvent>) {
        loop {
            if let Some(mut call) = self.call.take() {
                call.body.push_str(&input);
                match advance(&mut call) {
                    Progress::Open => {
                        self.call = Some(call);
                        return;
                    }
                    Progress::Closed { text_end, rest_from } => {
                        match decode(self.syntax, &call.body[..text_end], &self.tools) {
                            Some(calls) => {
                                self.release_calls(calls, out);
                                self.boundary = true;
                                self.after_call = true;
                                input = call.body[rest_from..].to_string();
                            }
                            None => input = self.give_back(call, out),
                        }
                    }
                    Progress::NotACall => input = self.give_back(call, out),
                }
            } else {
                match self.text(input, out) {
                    Some(rest) => input = rest,
                    None => return,
                }
            }
        }
    }

    /// Releases what is ordinary text in `input`; opens a call if one starts
    /// and returns the text after its marker. Holds back what may still
    /// become a marker.
    fn text(&mut self, input: String, out: &mut Vec<ParsedEvent>) -> Option<String> {
        let seps = if self.boundary { self.separators_len(&input) } else { 0 };
        if self.boundary {
            let after = &input[seps..];
            if let Some(op) = openers(self.syntax).iter().find(|o| o.at_boundary_only && after.starts_with(o.marker)) {
                return Some(self.open(op, &input, seps, seps, out));
            }
        }
        let found = openers(self.syntax)
            .iter()
            .filter(|o| !o.at_boundary_only)
            .filter_map(|o| input.find(o.marker).map(|at| (at, o)))
            .min_by_key(|(at, _)| *at);
        if let Some((at, op)) = found {
            return Some(self.open(op, &input, seps, at, out));
        }
        let markers: Vec<&str> =
            openers(self.syntax).iter().filter(|o| !o.at_boundary_only).map(|o| o.marker).collect();
        let hold = partial_suffix(&input, &markers);
        let release = input.len() - hold;
        if self.boundary && release <= seps {
            // Still only separators (and perhaps a marker's beginning).
            self.held = input;
        } else {
            self.boundary = false;
            self.after_call = false;
            self.held = input[release..].to_string();
            emit(out, input[..release].to_string());
        }
        None
    }

    /// Starts a call whose marker sits at `at`; text before it is released
    /// unless it is only boundary separators.
    fn open(&mut self, op: &'static Opener, input: &str, seps: usize, at: usize, out: &mut Vec<ParsedEvent>) -> String {
        let mut lead = String::new();
        if self.boundary && at <= seps {
            lead = input[..at].to_string();
        } else {
            emit(out, input[..at].to_string());
        }
        self.boundary = false;
        self.after_call = false;
        let body_from = if op.in_body { at } else { at + op.marker.len() };
        self.call = Some(OpenCall { opener: op, lead, body: String::new(), scanned: 0, json: None });
        input[body_from..].to_string()
    }

    /// A call that turned out not to be one: its marker becomes text and the
    /// rest is read again, as it may hold a real call.
    fn give_back(&mut self, call: OpenCall, out: &mut Vec<ParsedEvent>) -> String {
        self.boundary = false;
        self.after_call = false;
        let marker = call.opener.marker;
        emit(out, format!("{}{marker}", call.lead));
        let from = if call.opener.in_body { marker.len() } else { 0 };
        call.body[from..].to_string()
    }

    fn release_calls(&mut self, calls: Vec<Decoded>, out: &mut Vec<ParsedEvent>) {
        for c in calls {
            let arguments = Value::Object(c.arguments).to_string();
            out.push(ParsedEvent::Call { index: self.next_index, id: new_call_id(), name: c.name, arguments });
            self.next_index += 1;
        }
    }

    /// Between and around calls: whitespace, and Llama's `;` between calls.
    fn is_separator(&self, c: char) -> bool {
        c.is_whitespace() || (c == ';' && self.after_call && self.syntax == ToolSyntax::PythonTagJson)
    }

    fn separators_len(&self, s: &str) -> usize {
        s.find(|c| !self.is_separator(c)).unwrap_or(s.len())
    }

    fn is_separators(&self, s: &str) -> bool {
        self.separators_len(s) == s.len()
    }
}

fn emit(out: &mut Vec<ParsedEvent>, text: String) {
    if !text.is_empty() {
        out.push(ParsedEvent::Text(text));
    }
}

/// Looks for the end of an open call in the text added since last time.
fn advance(call: &mut OpenCall) -> Progress {
    match call.opener.close {
        Close::Marker(end) => {
            // The marker may straddle the previous push.
            let mut from = call.scanned.saturating_sub(end.len() - 1);
            while !call.body.is_char_boundary(from) {
                from -= 1;
            }
            call.scanned = call.body.len();
            match call.body[from..].find(end) {
                Some(at) => Progress::Closed { text_end: from + at, rest_from: from + at + end.len() },
                None => Progress::Open,
            }
        }
        Close::JsonValue => {
            if call.json.is_none() {
                call.json = Some((0, JsonEnd::default()));
            }
            scan_json(call)
        }
        Close::ToolCallsHeader => {
            if call.json.is_none() {
                match mistral_json_start(&call.body) {
                    Ok(Some(start)) => {
                        call.json = Some((start, JsonEnd::default()));
                        call.scanned = start;
                    }
                    Ok(None) => return Progress::Open,
                    Err(()) => return Progress::NotACall,
                }
            }
            scan_json(call)
        }
    }
}

fn scan_json(call: &mut OpenCall) -> Progress {
    let Some((_, scanner)) = call.json.as_mut() else { return Progress::Open };
    let from = call.scanned;
    call.scanned = call.body.len();
    match scanner.feed(&call.body[from..]) {
        Scan::Open => Progress::Open,
        Scan::End(e) => Progress::Closed { text_end: from + e, rest_from: from + e },
        Scan::NotJson => Progress::NotACall,
    }
}

/// Where the JSON of a Mistral call starts: at once for `[...]`, after
/// `[ARGS]` for `NAME[ARGS]{...}`. `Ok(None)` while the header is still
/// being written; `Err` once it cannot be a header.
fn mistral_json_start(body: &str) -> Result<Option<usize>, ()> {
    let lead = body.len() - body.trim_start().len();
    let t = &body[lead..];
    if t.starts_with('[') {
        return Ok(Some(lead));
    }
    if let Some(at) = t.find("[ARGS]") {
        let name = t[..at].trim_end();
        let ok = !name.is_empty() && name.chars().all(crate::decoded::is_name_char);
        return if ok { Ok(Some(lead + at + "[ARGS]".len())) } else { Err(()) };
    }
    let name_len = t.find(|c| !crate::decoded::is_name_char(c)).unwrap_or(t.len());
    if partial_suffix(&t[name_len..], &["[ARGS]"]) == t.len() - name_len {
        Ok(None)
    } else {
        Err(())
    }
}

/// The length of the longest end of `s` that is a proper beginning of one of
/// `markers` (what must be held back because a marker may be arriving).
fn partial_suffix(s: &str, markers: &[&str]) -> usize {
    let mut best = 0;
    for m in markers {
        for (i, _) in m.char_indices().skip(1) {
            if i > best && s.ends_with(&m[..i]) {
                best = i;
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_suffixes() {
        assert_eq!(partial_suffix("hello <tool", &["<tool_call>"]), 5);
        assert_eq!(partial_suffix("hello <tool_call>", &["<tool_call>"]), 0);
        assert_eq!(partial_suffix("x<", &["<tool_call>", "<function="]), 1);
        assert_eq!(partial_suffix("x<f", &["<tool_call>", "<function="]), 2);
        assert_eq!(partial_suffix("abc", &["<tool_call>"]), 0);
    }

    #[test]
    fn mistral_headers() {
        assert_eq!(mistral_json_start("get_weather[ARGS]{"), Ok(Some(17)));
        assert_eq!(mistral_json_start(" [{\"name\""), Ok(Some(1)));
        assert_eq!(mistral_json_start("get_wea"), Ok(None));
        assert_eq!(mistral_json_start("get_weather[AR"), Ok(None));
        assert_eq!(mistral_json_start("get weather"), Err(()));
        assert_eq!(mistral_json_start("f[X"), Err(()));
        assert_eq!(mistral_json_start("bad name[ARGS]{}"), Err(()));
    }
}
