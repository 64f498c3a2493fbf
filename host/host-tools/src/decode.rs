//! The text of one call (what lies between its markers) → function names and
//! arguments. `None` means the text is not a call in that syntax; the parser
//! then gives it back as plain text.

use crate::decoded::{is_name_char, Decoded};
use crate::request::Tool;
use crate::syntax::ToolSyntax;
use crate::{gemma_call, xml_call};
use serde_json::{Map, Value};

pub(crate) fn decode(syntax: ToolSyntax, text: &str, tools: &[Tool]) -> Option<Vec<Decoded>> {
    let calls = match syntax {
        ToolSyntax::Json | ToolSyntax::Hermes | ToolSyntax::PythonTagJson => json_calls(text)?,
        ToolSyntax::ToolCallsList | ToolSyntax::ToolCallsArgs => mistral_calls(text)?,
        ToolSyntax::XmlFunction => xml_call::decode(text, tools)?,
        ToolSyntax::PipeToolCall => gemma_call::decode(text, "<|\"|>")?,
        ToolSyntax::FunctionCallTags => gemma_call::decode(text, "<escape>")?,
    };
    (!calls.is_empty()).then_some(calls)
}

/// One JSON value holding a call object or an array of them, and nothing
/// else but whitespace.
fn json_calls(text: &str) -> Option<Vec<Decoded>> {
    match serde_json::from_str::<Value>(text.trim()).ok()? {
        Value::Array(items) => items.into_iter().map(call_from_json).collect(),
        obj @ Value::Object(_) => Some(vec![call_from_json(obj)?]),
        _ => None,
    }
}

/// `{"name": ..., "arguments": {...}}`. Llama names the arguments
/// "parameters"; some models send them as a JSON string; a call with no
/// arguments may leave them out.
fn call_from_json(v: Value) -> Option<Decoded> {
    let Value::Object(mut obj) = v else { return None };
    let name = match obj.remove("name")? {
        Value::String(s) if !s.trim().is_empty() => s.trim().to_string(),
        _ => return None,
    };
    let args = obj.remove("arguments").or_else(|| obj.remove("parameters"));
    let arguments = match args {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m,
        Some(Value::String(s)) => match serde_json::from_str::<Value>(&s).ok()? {
            Value::Object(m) => m,
            _ => return None,
        },
        Some(_) => return None,
    };
    Some(Decoded { name, arguments })
}

/// `[{"name": ..., "arguments": ...}, ...]` (older templates) or
/// `NAME[ARGS]{...}` (newer ones); models trained on one sometimes write the
/// other, so both are read whichever the template showed.
fn mistral_calls(text: &str) -> Option<Vec<Decoded>> {
    let t = text.trim_start();
    if t.starts_with('[') || t.starts_with('{') {
        return json_calls(t);
    }
    let (name, args) = t.split_once("[ARGS]")?;
    let name = name.trim();
    if name.is_empty() || !name.chars().all(is_name_char) {
        return None;
    }
    match serde_json::from_str::<Value>(args.trim()).ok()? {
        Value::Object(arguments) => Some(vec![Decoded { name: name.to_string(), arguments }]),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn one(syntax: ToolSyntax, text: &str) -> Option<(String, Value)> {
        let mut calls = decode(syntax, text, &[])?;
        assert_eq!(calls.len(), 1);
        let c = calls.remove(0);
        Some((c.name, Value::Object(c.arguments)))
    }

    #[test]
    fn json_forms() {
        let want = Some(("f".to_string(), json!({ "a": 1 })));
        assert_eq!(one(ToolSyntax::Hermes, "\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n"), want);
        assert_eq!(one(ToolSyntax::PythonTagJson, "{\"name\": \"f\", \"parameters\": {\"a\": 1}}"), want);
        assert_eq!(one(ToolSyntax::Hermes, "{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}"), want);
        assert_eq!(one(ToolSyntax::Json, "{\"name\": \"f\"}"), Some(("f".to_string(), json!({}))));
        let two = decode(
            ToolSyntax::Json,
            r#"[{"name": "f", "arguments": {}}, {"name": "g", "arguments": {"b": [1]}}]"#,
            &[],
        );
        assert_eq!(two.unwrap().iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["f", "g"]);
    }

    #[test]
    fn json_rejects() {
        for text in [
            "",
            "[]",
            "{\"name\": \"f\", \"arguments\": {\"a\": 1}} extra",
            "{\"name\": \"\", \"arguments\": {}}",
            "{\"arguments\": {}}",
            "{\"name\": \"f\", \"arguments\": [1]}",
            "{\"name\": \"f\", \"arguments\": \"not json\"}",
            "\"f\"",
            "{\"name\": \"f\", \"arguments\": {",
        ] {
            assert_eq!(decode(ToolSyntax::Hermes, text, &[]), None, "{text}");
        }
    }

    #[test]
    fn mistral_forms() {
        let want = Some(("get_weather".to_string(), json!({ "city": "Paris" })));
        assert_eq!(one(ToolSyntax::ToolCallsArgs, "get_weather[ARGS]{\"city\": \"Paris\"}"), want);
        assert_eq!(
            one(ToolSyntax::ToolCallsList, "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]"),
            want
        );
        assert_eq!(one(ToolSyntax::ToolCallsList, "get_weather[ARGS]{\"city\": \"Paris\"}"), want);
        assert_eq!(decode(ToolSyntax::ToolCallsArgs, "get weather[ARGS]{}", &[]), None);
        assert_eq!(decode(ToolSyntax::ToolCallsArgs, "f[ARGS][1]", &[]), None);
        assert_eq!(decode(ToolSyntax::ToolCallsArgs, "f{}", &[]), None);
    }
}
