//! OpenAI chat messages → the messages HF chat templates expect.
//!
//! Templates index `tool_call.function.arguments` as a mapping and read a
//! tool result's function `name`, while OpenAI sends arguments as a JSON
//! string and tool results with only `tool_call_id`. Messages are checked
//! the way OpenAI checks them, so a bad history is a 400 naming the field
//! rather than a template error.

use crate::error::ToolError;
use serde_json::{Map, Value};
use std::collections::HashMap;

/// Checks `messages` and rewrites them for a chat template: `developer`
/// becomes `system`, text-part arrays become strings, assistant tool-call
/// arguments become objects, tool results get the called function's `name`,
/// an assistant's past reasoning sent as `reasoning` becomes `reasoning_content`.
/// Fields the rewrite does not touch pass through (templates read some,
/// e.g. `reasoning_content`).
pub fn template_messages(messages: &[Value]) -> Result<Vec<Value>, ToolError> {
    let mut names_by_call_id: HashMap<String, String> = HashMap::new();
    let mut out = Vec::with_capacity(messages.len());
    for (i, message) in messages.iter().enumerate() {
        let at = format!("messages[{i}]");
        let obj = message.as_object().ok_or_else(|| ToolError::new(&at, "expected an object"))?;
        let role = match obj.get("role") {
            Some(Value::String(r)) => r.as_str(),
            Some(_) => return Err(ToolError::new(format!("{at}.role"), "expected a string")),
            None => return Err(ToolError::new(format!("{at}.role"), "missing required parameter")),
        };
        let mut m = obj.clone();
        match role {
            "system" | "developer" | "user" => {
                m.insert("content".into(), Value::String(required_text(obj, &at)?));
                if role == "developer" {
                    m.insert("role".into(), "system".into());
                }
            }
            "assistant" => assistant(obj, &mut m, &at, &mut names_by_call_id)?,
            "tool" => {
                m.insert("content".into(), Value::String(required_text(obj, &at)?));
                let id = match obj.get("tool_call_id") {
                    Some(Value::String(id)) => id,
                    Some(_) => return Err(ToolError::new(format!("{at}.tool_call_id"), "expected a string")),
                    None => return Err(ToolError::new(format!("{at}.tool_call_id"), "missing required parameter")),
                };
                let named = matches!(obj.get("name"), Some(Value::String(_)));
                if let (false, Some(name)) = (named, names_by_call_id.get(id)) {
                    m.insert("name".into(), Value::String(name.clone()));
                }
            }
            other => {
                return Err(ToolError::new(
                    format!("{at}.role"),
                    format!("unknown role '{other}'; expected system, developer, user, assistant or tool"),
                ))
            }
        }
        out.push(Value::Object(m));
    }
    Ok(out)
}

fn assistant(
    obj: &Map<String, Value>,
    m: &mut Map<String, Value>,
    at: &str,
    names_by_call_id: &mut HashMap<String, String>,
) -> Result<(), ToolError> {
    let calls = match obj.get("tool_calls") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(calls)) => calls
            .iter()
            .enumerate()
            .map(|(j, c)| tool_call(c, &format!("{at}.tool_calls[{j}]"), names_by_call_id))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(ToolError::new(format!("{at}.tool_calls"), "expected an array")),
    };
    let content = text(obj.get("content"), &format!("{at}.content"))?;
    if content.is_none() && calls.is_empty() {
        return Err(ToolError::new(format!("{at}.content"), "an assistant message needs content or tool_calls"));
    }
    m.insert("content".into(), content.map_or(Value::Null, Value::String));
    // Past reasoning is `reasoning_content` to templates; some clients send
    // it back as `reasoning` (vLLM's newer name, OpenRouter's).
    match (obj.get("reasoning_content"), obj.get("reasoning")) {
        (None | Some(Value::Null), Some(Value::String(r))) => {
            m.insert("reasoning_content".into(), Value::String(r.clone()));
        }
        (Some(r), _) if !r.is_string() && !r.is_null() => {
            return Err(ToolError::new(format!("{at}.reasoning_content"), "expected a string"));
        }
        _ => {}
    }
    if calls.is_empty() {
        m.remove("tool_calls");
    } else {
        m.insert("tool_calls".into(), Value::Array(calls));
    }
    Ok(())
}

/// One `tool_calls` entry with its arguments as an object; remembers the
/// function's name for the tool results that answer it.
fn tool_call(call: &Value, at: &str, names_by_call_id: &mut HashMap<String, String>) -> Result<Value, ToolError> {
    let obj = call.as_object().ok_or_else(|| ToolError::new(at, "expected an object"))?;
    let id = match obj.get("id") {
        Some(Value::String(id)) => id.clone(),
        Some(_) => return Err(ToolError::new(format!("{at}.id"), "expected a string")),
        None => return Err(ToolError::new(format!("{at}.id"), "missing required parameter")),
    };
    match obj.get("type") {
        None => {}
        Some(Value::String(t)) if t == "function" => {}
        Some(_) => return Err(ToolError::new(format!("{at}.type"), "expected \"function\"")),
    }
    let function = match obj.get("function") {
        Some(Value::Object(f)) => f,
        Some(_) => return Err(ToolError::new(format!("{at}.function"), "expected an object")),
        None => return Err(ToolError::new(format!("{at}.function"), "missing required parameter")),
    };
    let name = match function.get("name") {
        Some(Value::String(n)) if !n.is_empty() => n.clone(),
        Some(_) => return Err(ToolError::new(format!("{at}.function.name"), "expected a non-empty string")),
        None => return Err(ToolError::new(format!("{at}.function.name"), "missing required parameter")),
    };
    let args_at = format!("{at}.function.arguments");
    let arguments = match function.get("arguments") {
        Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
            Ok(Value::Object(args)) => args,
            Ok(_) => return Err(ToolError::new(args_at, "expected a JSON object")),
            Err(e) => return Err(ToolError::new(args_at, format!("not valid JSON ({e})"))),
        },
        // Clients that already send an object mean the same thing.
        Some(Value::Object(args)) => args.clone(),
        Some(_) => return Err(ToolError::new(args_at, "expected a string holding a JSON object")),
        None => return Err(ToolError::new(args_at, "missing required parameter")),
    };
    names_by_call_id.insert(id.clone(), name.clone());
    let mut function = function.clone();
    function.insert("name".into(), Value::String(name));
    function.insert("arguments".into(), Value::Object(arguments));
    let mut out = obj.clone();
    out.insert("id".into(), Value::String(id));
    out.insert("type".into(), "function".into());
    out.insert("function".into(), Value::Object(function));
    Ok(out.into())
}

/// Content that must be present (not null).
fn required_text(obj: &Map<String, Value>, at: &str) -> Result<String, ToolError> {
    let at = format!("{at}.content");
    text(obj.get("content"), &at)?.ok_or_else(|| ToolError::new(at, "missing required parameter"))
}

/// A string, or an array of `{"type": "text", "text": ...}` parts joined
/// (OpenAI reads the parts as one text); `None` for absent or null.
fn text(content: Option<&Value>, at: &str) -> Result<Option<String>, ToolError> {
    let parts = match content {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(s)) => return Ok(Some(s.clone())),
        Some(Value::Array(parts)) => parts,
        Some(_) => return Err(ToolError::new(at, "expected a string or an array of content parts")),
    };
    let mut joined = String::new();
    for (k, part) in parts.iter().enumerate() {
        let part_at = format!("{at}[{k}]");
        match part.get("type").and_then(Value::as_str) {
            Some("text") => {}
            Some(other) => {
                return Err(ToolError::new(
                    format!("{part_at}.type"),
                    format!("content parts of type '{other}' are not supported; only 'text' is"),
                ))
            }
            None => return Err(ToolError::new(format!("{part_at}.type"), "missing required parameter")),
        }
        match part.get("text") {
            Some(Value::String(t)) => joined.push_str(t),
            _ => return Err(ToolError::new(format!("{part_at}.text"), "expected a string")),
        }
    }
    Ok(Some(joined))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn err_param(messages: Value) -> String {
        template_messages(messages.as_array().unwrap()).expect_err("expected an error").param
    }

    #[test]
    fn rewrites_a_tool_conversation() {
        let messages = json!([
            { "role": "developer", "content": "Be brief." },
            { "role": "user", "content": [{ "type": "text", "text": "Weather in " }, { "type": "text", "text": "Paris?" }] },
            { "role": "assistant", "content": null, "reasoning_content": "Look it up.", "tool_calls": [
                { "id": "call_1", "type": "function", "function": { "name": "get_weather", "arguments": "{\"city\": \"Paris\", \"days\": 2}" } }
            ]},
            { "role": "tool", "tool_call_id": "call_1", "content": "18C" },
            { "role": "tool", "tool_call_id": "call_x", "name": "kept", "content": [{ "type": "text", "text": "ok" }] },
            { "role": "assistant", "content": "It is 18C.", "reasoning": "Report it." }
        ]);
        let out = template_messages(messages.as_array().unwrap()).unwrap();
        assert_eq!(
            Value::Array(out),
            json!([
                { "role": "system", "content": "Be brief." },
                { "role": "user", "content": "Weather in Paris?" },
                { "role": "assistant", "content": null, "reasoning_content": "Look it up.", "tool_calls": [
                    { "id": "call_1", "type": "function", "function": { "name": "get_weather", "arguments": { "city": "Paris", "days": 2 } } }
                ]},
                { "role": "tool", "tool_call_id": "call_1", "content": "18C", "name": "get_weather" },
                { "role": "tool", "tool_call_id": "call_x", "name": "kept", "content": "ok" },
                { "role": "assistant", "content": "It is 18C.", "reasoning": "Report it.", "reasoning_content": "Report it." }
            ])
        );
    }

    #[test]
    fn argument_order_is_kept() {
        let messages = json!([{ "role": "assistant", "tool_calls": [
            { "id": "a", "type": "function", "function": { "name": "f", "arguments": "{\"z\": 1, \"a\": 2}" } }
        ]}]);
        let out = template_messages(messages.as_array().unwrap()).unwrap();
        let args = out[0]["tool_calls"][0]["function"]["arguments"].as_object().unwrap();
        assert_eq!(args.keys().collect::<Vec<_>>(), ["z", "a"]);
    }

    #[test]
    fn rejects_what_openai_rejects() {
        let call = |args: Value| json!([{ "role": "assistant", "tool_calls": [{ "id": "c", "type": "function", "function": { "name": "f", "arguments": args } }] }]);
        let cases = [
            (json!([3]), "messages[0]"),
            (json!([{ "content": "x" }]), "messages[0].role"),
            (json!([{ "role": "robot", "content": "x" }]), "messages[0].role"),
            (json!([{ "role": "user", "content": "a" }, { "role": "user" }]), "messages[1].content"),
            (json!([{ "role": "system", "content": null }]), "messages[0].content"),
            (json!([{ "role": "user", "content": 5 }]), "messages[0].content"),
            (
                json!([{ "role": "user", "content": [{ "type": "image_url", "image_url": {} }] }]),
                "messages[0].content[0].type",
            ),
            (json!([{ "role": "user", "content": [{ "type": "text" }] }]), "messages[0].content[0].text"),
            (json!([{ "role": "assistant", "content": null }]), "messages[0].content"),
            (json!([{ "role": "assistant" }]), "messages[0].content"),
            (json!([{ "role": "tool", "content": "x" }]), "messages[0].tool_call_id"),
            (json!([{ "role": "tool", "tool_call_id": "c" }]), "messages[0].content"),
            (call(json!("{not json")), "messages[0].tool_calls[0].function.arguments"),
            (call(json!("[1, 2]")), "messages[0].tool_calls[0].function.arguments"),
            (call(json!(7)), "messages[0].tool_calls[0].function.arguments"),
            (
                json!([{ "role": "assistant", "tool_calls": [{ "type": "function", "function": { "name": "f", "arguments": "{}" } }] }]),
                "messages[0].tool_calls[0].id",
            ),
            (
                json!([{ "role": "assistant", "tool_calls": [{ "id": "c", "type": "function", "function": { "arguments": "{}" } }] }]),
                "messages[0].tool_calls[0].function.name",
            ),
            (json!([{ "role": "assistant", "tool_calls": {} }]), "messages[0].tool_calls"),
        ];
        for (messages, param) in cases {
            assert_eq!(err_param(messages.clone()), param, "{messages}");
        }
    }

    #[test]
    fn accepts_object_arguments_and_empty_content() {
        let messages = json!([
            { "role": "user", "content": "" },
            { "role": "assistant", "content": "", "tool_calls": [{ "id": "c", "function": { "name": "f", "arguments": { "a": 1 } } }] }
        ]);
        let out = template_messages(messages.as_array().unwrap()).unwrap();
        assert_eq!(out[1]["tool_calls"][0]["function"]["arguments"], json!({ "a": 1 }));
        assert_eq!(out[1]["tool_calls"][0]["type"], json!("function"));
    }
}
