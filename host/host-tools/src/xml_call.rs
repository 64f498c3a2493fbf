//! Qwen3-Coder / Qwen3.5 calls:
//! `<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n</function>`.
//! Values are raw text, so their JSON type comes from the tool's schema.

use crate::decoded::{is_name_char, Decoded};
use crate::request::Tool;
use serde_json::{Map, Number, Value};

const FUNCTION: &str = "<function=";
const FUNCTION_END: &str = "</function>";
const PARAMETER: &str = "<parameter=";
const PARAMETER_END: &str = "</parameter>";

/// One or more `<function=...>` blocks; the last one may lack
/// `</function>` (the parser cuts a call opened by `<function=` at it).
pub(crate) fn decode(text: &str, tools: &[Tool]) -> Option<Vec<Decoded>> {
    let mut rest = text;
    let mut calls = Vec::new();
    loop {
        rest = rest.trim_start();
        if rest.is_empty() {
            return Some(calls);
        }
        let after = rest.strip_prefix(FUNCTION)?;
        let (name, after) = after.split_once('>')?;
        let name = name.trim();
        if name.is_empty() || !name.chars().all(is_name_char) {
            return None;
        }
        let (body, next) = match after.find(FUNCTION_END) {
            Some(end) => (&after[..end], &after[end + FUNCTION_END.len()..]),
            None => (after, ""),
        };
        let tool = tools.iter().find(|t| t.name == name);
        calls.push(Decoded { name: name.to_string(), arguments: parameters(body, tool)? });
        rest = next;
    }
}

/// The `<parameter=...>` blocks of one function. A block left unclosed ends
/// where the next one starts, as models do drop `</parameter>` at times.
fn parameters(body: &str, tool: Option<&Tool>) -> Option<Map<String, Value>> {
    let mut args = Map::new();
    let mut rest = body;
    while let Some(start) = rest.find(PARAMETER) {
        let after = &rest[start + PARAMETER.len()..];
        let (key, after) = after.split_once('>')?;
        let key = key.trim();
        if key.is_empty() {
            return None;
        }
        let end = [after.find(PARAMETER_END), after.find(PARAMETER)].into_iter().flatten().min();
        let (raw, next) = match end {
            Some(e) if after[e..].starts_with(PARAMETER_END) => (&after[..e], &after[e + PARAMETER_END.len()..]),
            Some(e) => (&after[..e], &after[e..]),
            None => (after, ""),
        };
        // The template puts the value on lines of its own; those two
        // newlines are framing, anything else belongs to the value.
        let raw = raw.strip_prefix('\n').unwrap_or(raw);
        let raw = raw.strip_suffix('\n').unwrap_or(raw);
        let schema = tool.and_then(|t| t.property(key));
        args.insert(key.to_string(), typed_value(raw, schema));
        rest = next;
    }
    Some(args)
}

/// Reads a raw value as the JSON type its schema declares; text that does
/// not fit the type stays a string rather than failing the whole call.
pub(crate) fn typed_value(raw: &str, schema: Option<&Value>) -> Value {
    let trimmed = raw.trim();
    if trimmed.eq_ignore_ascii_case("null") {
        return Value::Null;
    }
    let Some(schema) = schema else { return Value::String(raw.to_string()) };
    let ty = match schema.get("type") {
        Some(Value::String(t)) => Some(t.as_str()),
        // ["integer", "null"] and the like: the first non-null type.
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).find(|t| *t != "null"),
        _ => None,
    };
    let parsed = || serde_json::from_str::<Value>(trimmed).ok();
    let value = match ty {
        Some("string") => None,
        Some("integer") => integer(trimmed),
        Some("number") => integer(trimmed).or_else(|| number(trimmed)),
        Some("boolean") => match trimmed.to_ascii_lowercase().as_str() {
            "true" => Some(Value::Bool(true)),
            "false" => Some(Value::Bool(false)),
            _ => None,
        },
        Some("object") => parsed().filter(Value::is_object),
        Some("array") => parsed().filter(Value::is_array),
        // No type (anyOf, enum, ...): structured values are read as JSON,
        // anything else stays text.
        _ => parsed().filter(|v| v.is_object() || v.is_array()),
    };
    value.unwrap_or_else(|| Value::String(raw.to_string()))
}

fn integer(s: &str) -> Option<Value> {
    if let Ok(i) = s.parse::<i64>() {
        return Some(Value::from(i));
    }
    // "3.0" is an integer written loosely.
    let f = s.parse::<f64>().ok()?;
    (f.fract() == 0.0 && f.abs() < 9.0e15).then(|| Value::from(f as i64))
}

fn number(s: &str) -> Option<Value> {
    Number::from_f64(s.parse::<f64>().ok()?).map(Value::Number)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tool() -> Tool {
        Tool {
            name: "run".into(),
            description: None,
            parameters: json!({ "type": "object", "properties": {
                "cmd": { "type": "string" }, "n": { "type": "integer" }, "x": { "type": "number" },
                "ok": { "type": "boolean" }, "opts": { "type": "object" }, "xs": { "type": "array" },
                "maybe": { "type": ["integer", "null"] }, "any": {}
            }}),
            strict: false,
        }
    }

    #[test]
    fn converts_by_schema() {
        let text = "\n<function=run>\n<parameter=cmd>\nls -la\n\n</parameter>\n<parameter=n>\n3\n</parameter>\n\
                    <parameter=x>\n2.5\n</parameter>\n<parameter=ok>\nTrue\n</parameter>\n\
                    <parameter=opts>\n{\"a\": [1]}\n</parameter>\n<parameter=xs>\n[1, 2]\n</parameter>\n\
                    <parameter=maybe>\n7\n</parameter>\n<parameter=any>\n{\"k\": 1}\n</parameter>\n\
                    <parameter=extra>\n42\n</parameter>\n</function>\n";
        let calls = decode(text, &[tool()]).unwrap();
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].name, "run");
        assert_eq!(
            Value::Object(calls[0].arguments.clone()),
            json!({ "cmd": "ls -la\n", "n": 3, "x": 2.5, "ok": true, "opts": { "a": [1] }, "xs": [1, 2],
                    "maybe": 7, "any": { "k": 1 }, "extra": "42" })
        );
    }

    #[test]
    fn without_a_schema_values_are_text() {
        let calls = decode("<function=f>\n<parameter=n>\n3\n</parameter>\n</function>", &[]).unwrap();
        assert_eq!(Value::Object(calls[0].arguments.clone()), json!({ "n": "3" }));
    }

    #[test]
    fn loose_forms() {
        // No </parameter> before the next parameter, no </function> at the end.
        let calls = decode("<function=run>\n<parameter=cmd>\nls\n<parameter=n>\n2.0\n", &[tool()]).unwrap();
        assert_eq!(Value::Object(calls[0].arguments.clone()), json!({ "cmd": "ls", "n": 2 }));
        let two = decode("<function=a>\n</function>\n<function=b>\n</function>", &[]).unwrap();
        assert_eq!(two.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["a", "b"]);
        // A value that does not fit its type stays text.
        let calls = decode("<function=run>\n<parameter=n>\nmany\n</parameter>\n</function>", &[tool()]).unwrap();
        assert_eq!(calls[0].arguments["n"], json!("many"));
    }

    #[test]
    fn rejects() {
        for text in ["{\"name\": \"f\"}", "<function=>\n</function>", "<function=a b>\n</function>", "<function=f"] {
            assert_eq!(decode(text, &[]), None, "{text}");
        }
    }
}
