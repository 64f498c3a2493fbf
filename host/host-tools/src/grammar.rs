//! llguidance (Lark) grammars that force tool calls in the model's own
//! syntax, for `tool_choice: "required"` and a named function. Arguments are
//! constrained by each tool's JSON Schema through `%json`, or property by
//! property where the syntax is not JSON (Qwen's XML, Gemma's notation).
//!
//! Markers that the tokenizer has as special tokens are written as token
//! references (`<tool_call>`, `<[5]>`): llguidance never spells a special
//! token out of text, so a quoted marker would force the model to write it
//! byte by byte, out of its training distribution.

use crate::grammar_args::{gemma_arguments, xml_arguments, Quote};
use crate::grammar_pieces::{quoted, standalone};
use crate::request::{Tool, ToolChoice};
use crate::syntax::ToolSyntax;
use serde_json::{json, Map, Value};

/// The grammar for a request's `tool_choice`, or `None` when the choice
/// leaves the model free (`auto`, `none`) or names no known tool.
/// `added_tokens` are the tokenizer's added tokens as `(id, content, special)`.
pub fn tool_choice_grammar(
    syntax: ToolSyntax,
    tools: &[Tool],
    choice: &ToolChoice,
    parallel: bool,
    added_tokens: &[(u32, String, bool)],
) -> Option<String> {
    let (chosen, multiple): (Vec<&Tool>, bool) = match choice {
        ToolChoice::Auto | ToolChoice::None => return None,
        ToolChoice::Required => (tools.iter().collect(), parallel),
        // A named function is called once, as OpenAI does.
        ToolChoice::Named(name) => (tools.iter().filter(|t| &t.name == name).collect(), false),
    };
    (!chosen.is_empty()).then(|| calls_grammar(syntax, &chosen, multiple, added_tokens))
}

/// A grammar whose every sentence is one call (or, with `multiple`, one or
/// more) of one of `tools`, written in `syntax`. `tools` must not be empty.
pub fn calls_grammar(
    syntax: ToolSyntax,
    tools: &[&Tool],
    multiple: bool,
    added_tokens: &[(u32, String, bool)],
) -> String {
    let mut g = Lark { tokens: added_tokens, rules: Vec::new() };
    let one_of = |prefix: &str| (0..tools.len()).map(|i| format!("{prefix}_{i}")).collect::<Vec<_>>().join(" | ");
    match syntax {
        ToolSyntax::Json => {
            if multiple {
                g.rule("start", &format!("%json {}", call_list_schema(tools, "arguments", true)));
            } else {
                g.rule("start", &one_of("fn"));
                g.json_call_rules(tools, "arguments");
            }
        }
        ToolSyntax::Hermes => {
            g.repeated_start(multiple, Some("\"\\n\""));
            let (open, close) = (g.marker("<tool_call>"), g.marker("</tool_call>"));
            g.rule("call", &format!("{open} \"\\n\" ({}) \"\\n\" {close}", one_of("fn")));
            g.json_call_rules(tools, "arguments");
        }
        ToolSyntax::PythonTagJson => {
            // The Llama 3.1-3.3 templates ask for bare JSON; `; ` is how
            // several calls are written where they are written at all.
            g.repeated_start(multiple, Some("\"; \""));
            g.rule("call", &one_of("fn"));
            g.json_call_rules(tools, "parameters");
        }
        ToolSyntax::ToolCallsList => {
            let open = g.marker("[TOOL_CALLS]");
            g.rule("start", &format!("{open} %json {}", call_list_schema(tools, "arguments", multiple)));
        }
        ToolSyntax::ToolCallsArgs => {
            g.repeated_start(multiple, None);
            let (open, args) = (g.marker("[TOOL_CALLS]"), g.marker("[ARGS]"));
            g.rule("call", &format!("{open} ({})", one_of("fn")));
            for (i, t) in tools.iter().enumerate() {
                let schema = standalone(&t.parameters, &[&t.parameters]);
                g.rule(&format!("fn_{i}"), &format!("{} {args} %json {schema}", quoted(&t.name)));
            }
        }
        ToolSyntax::XmlFunction => {
            g.repeated_start(multiple, Some("\"\\n\""));
            let (open, close) = (g.marker("<tool_call>"), g.marker("</tool_call>"));
            g.rule("call", &format!("{open} \"\\n\" ({}) \"\\n\" {close}", one_of("fn")));
            for (i, t) in tools.iter().enumerate() {
                let args = xml_arguments(&mut g.rules, &format!("fn_{i}"), t);
                let head = quoted(&format!("<function={}>\n", t.name));
                g.rule(&format!("fn_{i}"), &format!("{head} {args} \"</function>\""));
            }
        }
        ToolSyntax::PipeToolCall | ToolSyntax::FunctionCallTags => {
            let (open, close, delim) = match syntax {
                ToolSyntax::PipeToolCall => ("<|tool_call>", "<tool_call|>", "<|\"|>"),
                _ => ("<start_function_call>", "<end_function_call>", "<escape>"),
            };
            g.repeated_start(multiple, None);
            let (open, close) = (g.marker(open), g.marker(close));
            g.rule("call", &format!("{open} \"call:\" ({}) {close}", one_of("fn")));
            let quote = Quote { text: delim, token: g.special(delim) };
            for (i, t) in tools.iter().enumerate() {
                let args = gemma_arguments(&mut g.rules, &format!("fn_{i}"), t, &quote);
                g.rule(&format!("fn_{i}"), &format!("{} {args} \"}}\"", quoted(&format!("{}{{", t.name))));
            }
        }
    }
    g.rules.join("\n") + "\n"
}

struct Lark<'a> {
    tokens: &'a [(u32, String, bool)],
    rules: Vec<String>,
}

impl Lark<'_> {
    fn rule(&mut self, name: &str, body: &str) {
        self.rules.push(format!("{name}: {body}"));
    }

    /// `start` as one `call`, or several with `sep` between them.
    fn repeated_start(&mut self, multiple: bool, sep: Option<&str>) {
        let body = match (multiple, sep) {
            (false, _) => "call".to_string(),
            (true, None) => "call+".to_string(),
            (true, Some(sep)) => format!("call ({sep} call)*"),
        };
        self.rule("start", &body);
    }

    /// `fn_i: %json {"name": const, <args_key>: parameters}` for each tool.
    fn json_call_rules(&mut self, tools: &[&Tool], args_key: &str) {
        for (i, t) in tools.iter().enumerate() {
            let schema = standalone(&call_schema(t, args_key), &[&t.parameters]);
            self.rule(&format!("fn_{i}"), &format!("%json {schema}"));
        }
    }

    /// A marker as a special-token reference when the tokenizer has it as
    /// one, else as text.
    fn marker(&self, text: &str) -> String {
        self.special(text).unwrap_or_else(|| quoted(text))
    }

    /// The special-token reference for `text`, if llguidance sees it as a
    /// special token: toktrie_hf_tokenizers takes every added token that is
    /// marked special or looks like `<...>` as one.
    fn special(&self, text: &str) -> Option<String> {
        let (id, content, _) = self.tokens.iter().find(|(_, content, special)| {
            content == text && (*special || (text.starts_with('<') && text.ends_with('>')))
        })?;
        // `<name>` is only readable as such when the name has no brackets
        // or whitespace and does not look like an id range.
        let by_name = content.len() > 2
            && content.starts_with('<')
            && content.ends_with('>')
            && !content.starts_with("<[")
            && !content[1..content.len() - 1].contains(|c: char| c == '<' || c == '>' || c.is_whitespace());
        Some(if by_name { content.clone() } else { format!("<[{id}]>") })
    }
}

/// `{"name": <const>, <args_key>: <parameters>}`, nothing else.
fn call_schema(tool: &Tool, args_key: &str) -> Value {
    let mut properties = Map::new();
    properties.insert("name".into(), json!({ "const": tool.name }));
    properties.insert(args_key.into(), tool.parameters.clone());
    json!({
        "type": "object",
        "properties": properties,
        "required": ["name", args_key],
        "additionalProperties": false,
    })
}

/// A JSON array of calls to any of `tools` (one or more with `multiple`).
fn call_list_schema(tools: &[&Tool], args_key: &str, multiple: bool) -> Value {
    let items: Vec<Value> = tools.iter().map(|t| call_schema(t, args_key)).collect();
    let mut schema = json!({ "type": "array", "items": { "anyOf": items }, "minItems": 1 });
    if !multiple {
        schema["maxItems"] = json!(1);
    }
    let params: Vec<&Value> = tools.iter().map(|t| &t.parameters).collect();
    standalone(&schema, &params)
}
