//! The streaming parser against whole-text parsing, per syntax: the same
//! answer fed whole, one character at a time and in random pieces must give
//! the same text and calls.

use host_tools::{parse_complete, parse_tools, Call, ParsedEvent, Tool, ToolCallParser, ToolSyntax};
use serde_json::{json, Value};

/// Text pieces merged, ids dropped (they differ per call by design).
#[derive(Debug, PartialEq)]
enum Piece {
    Text(String),
    Call(usize, String, Value),
}

fn normalize(events: Vec<ParsedEvent>) -> Vec<Piece> {
    let mut out: Vec<Piece> = Vec::new();
    for e in events {
        match e {
            ParsedEvent::Text(t) => match out.last_mut() {
                Some(Piece::Text(prev)) => prev.push_str(&t),
                _ => out.push(Piece::Text(t)),
            },
            ParsedEvent::Call { index, id, name, arguments } => {
                assert!(id.starts_with("call_") && id.len() == 29, "{id}");
                out.push(Piece::Call(index, name, serde_json::from_str(&arguments).unwrap()));
            }
        }
    }
    out
}

fn stream(syntax: ToolSyntax, tools: &[Tool], pieces: &[&str]) -> Vec<Piece> {
    let mut p = ToolCallParser::new(syntax).with_tools(tools);
    let mut events = Vec::new();
    for piece in pieces {
        events.extend(p.push(piece));
    }
    events.extend(p.finish());
    normalize(events)
}

/// A small deterministic generator for piece sizes.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, bound: usize) -> usize {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 33) as usize) % bound
    }
}

/// Parses `text` whole, per character and in random pieces; all must agree.
fn parse_everywhere(syntax: ToolSyntax, tools: &[Tool], text: &str) -> Vec<Piece> {
    let whole = stream(syntax, tools, &[text]);
    let chars: Vec<&str> = text.char_indices().map(|(i, c)| &text[i..i + c.len_utf8()]).collect();
    assert_eq!(stream(syntax, tools, &chars), whole, "one character at a time: {text:?}");
    let mut rng = Lcg(text.len() as u64);
    for _ in 0..20 {
        let mut pieces = Vec::new();
        let mut i = 0;
        while i < chars.len() {
            let n = 1 + rng.next(12);
            let end = (i + n).min(chars.len());
            pieces.push(chars[i..end].concat());
            i = end;
        }
        let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
        assert_eq!(stream(syntax, tools, &refs), whole, "pieces {refs:?}");
    }
    let (content, calls) = parse_complete(syntax, text, tools);
    let mut from_complete: Vec<Piece> = Vec::new();
    let texts: String =
        whole.iter().filter_map(|p| if let Piece::Text(t) = p { Some(t.as_str()) } else { None }).collect();
    assert_eq!(content, texts);
    for Call { index, name, arguments, .. } in calls {
        from_complete.push(Piece::Call(index, name, serde_json::from_str(&arguments).unwrap()));
    }
    let whole_calls: Vec<&Piece> = whole.iter().filter(|p| matches!(p, Piece::Call(..))).collect();
    assert_eq!(whole_calls, from_complete.iter().collect::<Vec<_>>());
    whole
}

fn text(s: &str) -> Piece {
    Piece::Text(s.to_string())
}

fn call(index: usize, name: &str, args: Value) -> Piece {
    Piece::Call(index, name.to_string(), args)
}

fn weather_tools() -> Vec<Tool> {
    parse_tools(Some(&json!([
        { "type": "function", "function": { "name": "get_weather", "parameters": { "type": "object", "properties": {
            "city": { "type": "string" }, "days": { "type": "integer" }, "metric": { "type": "boolean" } } } } },
        { "type": "function", "function": { "name": "get_time" } }
    ])))
    .unwrap()
}

/// Text with no real call comes back exactly as written.
fn assert_all_text(syntax: ToolSyntax, s: &str) {
    assert_eq!(parse_everywhere(syntax, &[], s), vec![text(s)], "{s:?}");
}

#[test]
fn hermes() {
    let out = parse_everywhere(
        ToolSyntax::Hermes,
        &[],
        "Let me check. ☀️\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n\
         <tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>\n",
    );
    assert_eq!(
        out,
        vec![
            text("Let me check. ☀️\n\n"),
            call(0, "get_weather", json!({ "city": "Paris" })),
            call(1, "get_time", json!({}))
        ]
    );
    let after = parse_everywhere(ToolSyntax::Hermes, &[], "<tool_call>{\"name\": \"f\"}</tool_call>\n\nDone.");
    assert_eq!(after, vec![call(0, "f", json!({})), text("\n\nDone.")]);
}

#[test]
fn marker_lookalikes_are_text() {
    assert_all_text(ToolSyntax::Hermes, "I like <tools> and <tool_calls> and <tool");
    assert_all_text(ToolSyntax::Hermes, "<tool_call>\nnot json\n</tool_call> after");
    assert_all_text(ToolSyntax::Hermes, "x <tool_call>\n{\"name\": \"f\", \"argu");
    assert_all_text(ToolSyntax::XmlFunction, "<functional> <function=bad name>\n</function>");
    assert_all_text(ToolSyntax::PythonTagJson, "Sure: {\"name\": \"f\", \"parameters\": {}}");
    assert_all_text(ToolSyntax::PythonTagJson, "{\"answer\": 42} is JSON");
    assert_all_text(ToolSyntax::PythonTagJson, "  {not json at all");
    assert_all_text(ToolSyntax::ToolCallsArgs, "[TOOL_CALLS] and some prose");
    assert_all_text(ToolSyntax::ToolCallsList, "[TOOL_CALLS][1, 2]");
    assert_all_text(ToolSyntax::PipeToolCall, "<|tool_call>call:f{a:<|\"|>unterminated");
    assert_all_text(ToolSyntax::Json, "[1, 2] and {\"x\": 1}");
}

#[test]
fn ordinary_text_is_not_delayed() {
    let mut p = ToolCallParser::new(ToolSyntax::Hermes);
    assert_eq!(p.push("Hello wor"), vec![ParsedEvent::Text("Hello wor".into())]);
    assert_eq!(p.push("ld <"), vec![ParsedEvent::Text("ld ".into())]);
    assert_eq!(p.push("tool"), vec![]);
    assert_eq!(p.push("s>"), vec![ParsedEvent::Text("<tools>".into())]);
    assert_eq!(p.finish(), vec![]);
    let mut p = ToolCallParser::new(ToolSyntax::PythonTagJson);
    assert_eq!(p.push("The {braces}"), vec![ParsedEvent::Text("The {braces}".into())]);
}

#[test]
fn cut_short_calls() {
    // The end marker missing or half written: the call is still whole.
    for tail in ["", "\n", "\n</tool_", "\n</tool_call"] {
        let s = format!("<tool_call>\n{{\"name\": \"f\", \"arguments\": {{\"a\": 1}}}}{tail}");
        assert_eq!(parse_everywhere(ToolSyntax::Hermes, &[], &s), vec![call(0, "f", json!({ "a": 1 }))], "{s:?}");
    }
    let xml = "<tool_call>\n<function=f>\n<parameter=a>\nx\n</parameter>\n</function>\n";
    assert_eq!(parse_everywhere(ToolSyntax::XmlFunction, &[], xml), vec![call(0, "f", json!({ "a": "x" }))]);
}

#[test]
fn qwen_xml() {
    let tools = weather_tools();
    let s = "Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Francisco\n</parameter>\n\
             <parameter=days>\n3\n</parameter>\n<parameter=metric>\ntrue\n</parameter>\n</function>\n</tool_call>\n\
             <function=get_time>\n</function>";
    assert_eq!(
        parse_everywhere(ToolSyntax::XmlFunction, &tools, s),
        vec![
            text("Checking.\n"),
            call(0, "get_weather", json!({ "city": "San Francisco", "days": 3, "metric": true })),
            call(1, "get_time", json!({})),
        ]
    );
}

#[test]
fn python_tag_json() {
    let s = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}; {\"name\": \"get_time\", \"parameters\": {}}";
    assert_eq!(
        parse_everywhere(ToolSyntax::PythonTagJson, &[], s),
        vec![call(0, "get_weather", json!({ "city": "Oslo" })), call(1, "get_time", json!({}))]
    );
    let tagged = "<|python_tag|>{\"name\": \"get_time\", \"parameters\": {\"tz\": \"UTC\"}}";
    assert_eq!(
        parse_everywhere(ToolSyntax::PythonTagJson, &[], tagged),
        vec![call(0, "get_time", json!({ "tz": "UTC" }))]
    );
    let leading = "\n  {\"name\": \"f\", \"arguments\": {}}";
    assert_eq!(parse_everywhere(ToolSyntax::PythonTagJson, &[], leading), vec![call(0, "f", json!({}))]);
}

#[test]
fn tool_calls_marker() {
    let old = "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}, {\"name\": \"get_time\", \"arguments\": {}}]";
    let want = vec![call(0, "get_weather", json!({ "city": "Rome" })), call(1, "get_time", json!({}))];
    assert_eq!(parse_everywhere(ToolSyntax::ToolCallsList, &[], old), want);
    let new = "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Rome\"}[TOOL_CALLS]get_time[ARGS]{}";
    assert_eq!(parse_everywhere(ToolSyntax::ToolCallsArgs, &[], new), want);
    let with_text = "Sure.[TOOL_CALLS]get_time[ARGS]{\"a\": \"}\"} Then more.";
    assert_eq!(
        parse_everywhere(ToolSyntax::ToolCallsArgs, &[], with_text),
        vec![text("Sure."), call(0, "get_time", json!({ "a": "}" })), text(" Then more.")]
    );
}

#[test]
fn gemma() {
    let s = "<|tool_call>call:get_weather{city:<|\"|>Zürich, CH<|\"|>,days:2}<tool_call|><|tool_call>call:get_time{}<tool_call|>";
    assert_eq!(
        parse_everywhere(ToolSyntax::PipeToolCall, &[], s),
        vec![call(0, "get_weather", json!({ "city": "Zürich, CH", "days": 2 })), call(1, "get_time", json!({}))]
    );
    let fg = "<start_function_call>call:get_weather{city:<escape>Lima<escape>}<end_function_call>";
    assert_eq!(
        parse_everywhere(ToolSyntax::FunctionCallTags, &[], fg),
        vec![call(0, "get_weather", json!({ "city": "Lima" }))]
    );
}

#[test]
fn plain_json() {
    let one = "{\"name\": \"get_time\", \"arguments\": {\"tz\": \"UTC\"}}";
    assert_eq!(parse_everywhere(ToolSyntax::Json, &[], one), vec![call(0, "get_time", json!({ "tz": "UTC" }))]);
    let many = " [{\"name\": \"a\", \"arguments\": {}}, {\"name\": \"b\", \"arguments\": {\"x\": [1]}}]";
    assert_eq!(
        parse_everywhere(ToolSyntax::Json, &[], many),
        vec![call(0, "a", json!({})), call(1, "b", json!({ "x": [1] }))]
    );
}

#[test]
fn whitespace_only_answers_vanish_around_calls() {
    assert_eq!(parse_everywhere(ToolSyntax::Hermes, &[], "  \n "), vec![]);
    assert_eq!(parse_everywhere(ToolSyntax::Hermes, &[], ""), vec![]);
    assert_eq!(
        parse_everywhere(ToolSyntax::Hermes, &[], "\n<tool_call>{\"name\": \"f\"}</tool_call>\n"),
        vec![call(0, "f", json!({}))]
    );
}
