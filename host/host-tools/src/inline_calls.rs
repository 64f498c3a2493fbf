//! Past tool calls for a model whose chat template has no tool syntax: the
//! template would drop an assistant turn's `tool_calls` (and many fail on
//! its null `content`), so the model would never see what it called. Such
//! a turn's calls become its text, written as the model writes calls
//! (`ToolSyntax::Json`: one `{"name", "arguments"}` object, an array of
//! them for several), after any text it had.

use crate::ToolSyntax;
use serde_json::{json, Value};

/// Rewrites `messages` (`template_messages`' output) for a template of
/// `syntax`; a model with a syntax of its own keeps them as they are.
pub fn inline_calls(messages: &mut [Value], syntax: ToolSyntax) {
    if syntax.is_native() {
        return;
    }
    for m in messages.iter_mut().filter(|m| m["role"] == "assistant") {
        let Some(Value::Array(calls)) = m.as_object_mut().and_then(|o| o.remove("tool_calls")) else { continue };
        let written: Vec<Value> = calls
            .iter()
            .map(|c| json!({ "name": c["function"]["name"], "arguments": c["function"]["arguments"] }))
            .collect();
        let calls_text = match written.as_slice() {
            [one] => one.to_string(),
            _ => Value::Array(written).to_string(),
        };
        let text = match m["content"].as_str().filter(|t| !t.is_empty()) {
            Some(t) => format!("{t}\n{calls_text}"),
            None => calls_text,
        };
        m["content"] = Value::String(text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(content: Value, calls: &[(&str, Value)]) -> Value {
        let calls: Vec<Value> = calls
            .iter()
            .enumerate()
            .map(|(i, (name, args))| {
                json!({ "id": format!("c{i}"), "type": "function", "function": { "name": name, "arguments": args } })
            })
            .collect();
        json!({ "role": "assistant", "content": content, "tool_calls": calls })
    }

    #[test]
    fn calls_become_the_text_a_model_without_syntax_writes() {
        let mut ms = vec![
            json!({ "role": "user", "content": "Weather?" }),
            turn(Value::Null, &[("get_weather", json!({ "city": "Paris" }))]),
            turn(json!("Both."), &[("a", json!({})), ("b", json!({ "n": 1 }))]),
        ];
        inline_calls(&mut ms, ToolSyntax::Json);
        assert_eq!(ms[0], json!({ "role": "user", "content": "Weather?" }));
        assert_eq!(
            ms[1],
            json!({ "role": "assistant", "content": r#"{"name":"get_weather","arguments":{"city":"Paris"}}"# })
        );
        assert_eq!(
            ms[2]["content"],
            json!("Both.\n[{\"name\":\"a\",\"arguments\":{}},{\"name\":\"b\",\"arguments\":{\"n\":1}}]")
        );
        assert!(ms[2].get("tool_calls").is_none());
    }

    #[test]
    fn a_model_with_its_own_syntax_keeps_its_calls() {
        let mut ms = vec![turn(Value::Null, &[("f", json!({}))])];
        let before = ms.clone();
        inline_calls(&mut ms, ToolSyntax::Hermes);
        assert_eq!(ms, before);
    }
}
