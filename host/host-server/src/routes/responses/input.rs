//! The Responses `input` as OpenAI-shaped chat messages: message items by
//! role, a turn's reasoning, calls and the text written after them as one
//! assistant turn, `function_call_output` items as `tool` messages. Each
//! wrong item is a 400 naming it.

use crate::assistant_turn::{into_messages, joining, AssistantTurn, Turn};
use crate::error::ApiError;
use serde_json::{json, Map, Value};

/// `input`: a string (one user message) or an array of items.
pub(super) fn input(v: &Value) -> Result<Vec<Value>, ApiError> {
    let items = match v {
        Value::String(s) => return Ok(vec![json!({ "role": "user", "content": s })]),
        Value::Array(items) => items,
        _ => return Err(ApiError::param("input", "`input` must be a string or an array of input items")),
    };
    let mut out: Vec<Turn> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let at = format!("input[{i}]");
        let obj = item.as_object().ok_or_else(|| ApiError::param(&at, format!("`{at}` must be an object")))?;
        match obj.get("type").and_then(Value::as_str) {
            None | Some("message") => {
                let (role, text) = message(obj, &at)?;
                if role == "assistant" {
                    // The answer after its reasoning item joins that turn;
                    // text written after the turn's calls (a response's
                    // output echoed back) stays in it too, as the stored
                    // conversation keeps it, so its results still follow it.
                    joining(&mut out, |last| last.reasoning_alone() || last.has_calls()).push_text(&text, "");
                } else {
                    out.push(Turn::Message(json!({ "role": role, "content": text })));
                }
            }
            Some("reasoning") => {
                // A turn's reasoning opens that assistant turn; its answer
                // and calls join it. Reasoning after the turn's calls (and
                // before their results) is still that turn's.
                let text = reasoning_text(obj, &at)?;
                joining(&mut out, AssistantTurn::has_calls).push_reasoning(&text);
            }
            Some("function_call") => {
                let arguments = string(obj, "arguments", &at)?;
                if !serde_json::from_str::<Value>(&arguments).is_ok_and(|a| a.is_object()) {
                    return Err(ApiError::param(
                        &format!("{at}.arguments"),
                        "`arguments` must be a string holding a JSON object",
                    ));
                }
                let (id, name) = (string(obj, "call_id", &at)?, string(obj, "name", &at)?);
                // Calls after an assistant message (or after each other)
                // belong to that assistant turn, as the model wrote them.
                joining(&mut out, |_| true).push_call(id.into(), name.into(), arguments.into());
            }
            Some("function_call_output") => {
                let output = text_or_parts(
                    obj.get("output"),
                    &format!("{at}.output"),
                    "`output` must be a string or an array of input_text parts",
                )?;
                out.push(Turn::Message(
                    json!({ "role": "tool", "tool_call_id": string(obj, "call_id", &at)?, "content": output }),
                ));
            }
            Some(other @ ("item_reference" | "file_search_call" | "web_search_call" | "computer_call")) => {
                return Err(ApiError::unsupported(
                    &format!("{at}.type"),
                    format!("input items of type '{other}' are not supported"),
                ))
            }
            Some(other) => {
                return Err(ApiError::param(&format!("{at}.type"), format!("unknown input item type '{other}'")))
            }
        }
    }
    Ok(into_messages(out))
}

/// A reasoning item's text: its `reasoning_text` content parts, joined,
/// else what its `encrypted_content` holds when this server sealed it
/// (`sealed`); its `summary` is a summary, not the reasoning, and is not read.
fn reasoning_text(obj: &Map<String, Value>, at: &str) -> Result<String, ApiError> {
    if !matches!(obj.get("summary"), None | Some(Value::Null) | Some(Value::Array(_))) {
        return Err(ApiError::param(&format!("{at}.summary"), "`summary` must be an array"));
    }
    let sealed = match obj.get("encrypted_content") {
        None | Some(Value::Null) => None,
        Some(Value::String(blob)) => super::sealed::unseal(blob),
        Some(_) => {
            return Err(ApiError::param(&format!("{at}.encrypted_content"), "`encrypted_content` must be a string"))
        }
    };
    let parts = match obj.get("content") {
        None | Some(Value::Null) => return Ok(sealed.unwrap_or_default()),
        Some(Value::Array(parts)) => parts,
        Some(_) => {
            return Err(ApiError::param(&format!("{at}.content"), "`content` must be an array of reasoning_text parts"))
        }
    };
    let mut text = String::new();
    for (k, p) in parts.iter().enumerate() {
        let at = format!("{at}.content[{k}]");
        match (p.get("type").and_then(Value::as_str), p.get("text")) {
            (Some("reasoning_text"), Some(Value::String(t))) => text.push_str(t),
            (Some("reasoning_text"), _) => {
                return Err(ApiError::param(&format!("{at}.text"), "a reasoning_text part's `text` must be a string"))
            }
            _ => return Err(ApiError::param(&format!("{at}.type"), "reasoning content parts are `reasoning_text`")),
        }
    }
    Ok(text)
}

/// A message item's role and its text.
fn message<'a>(obj: &'a Map<String, Value>, at: &str) -> Result<(&'a str, String), ApiError> {
    let role = match obj.get("role").and_then(Value::as_str) {
        Some(r @ ("user" | "assistant" | "system" | "developer")) => r,
        Some(other) => {
            return Err(ApiError::param(
                &format!("{at}.role"),
                format!("unknown role '{other}'; expected user, assistant, system or developer"),
            ))
        }
        None => return Err(ApiError::param(&format!("{at}.role"), format!("`{at}.role` is required"))),
    };
    let content = text_or_parts(
        obj.get("content"),
        &format!("{at}.content"),
        "`content` must be a string or an array of content parts",
    )?;
    Ok((role, content))
}

/// A field at `at` that holds a string or an array of text parts, as its
/// text; else the error `wrong`.
fn text_or_parts(value: Option<&Value>, at: &str, wrong: &str) -> Result<String, ApiError> {
    match value {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => text_parts(parts, at),
        _ => Err(ApiError::param(at, wrong)),
    }
}

/// `input_text` / `output_text` parts (and a refusal, which is text too), joined.
fn text_parts(parts: &[Value], at: &str) -> Result<String, ApiError> {
    let mut joined = String::new();
    for (k, p) in parts.iter().enumerate() {
        let at = format!("{at}[{k}]");
        let (kind, field) = match p.get("type").and_then(Value::as_str) {
            Some(t @ ("input_text" | "output_text" | "text")) => (t, "text"),
            Some(t @ "refusal") => (t, "refusal"),
            Some(t @ ("input_image" | "input_file" | "input_audio")) => {
                return Err(ApiError::unsupported(
                    &format!("{at}.type"),
                    format!("content parts of type '{t}' are not supported"),
                ))
            }
            Some(t) => return Err(ApiError::param(&format!("{at}.type"), format!("unknown content part type '{t}'"))),
            None => return Err(ApiError::param(&format!("{at}.type"), format!("`{at}.type` is required"))),
        };
        match p.get(field) {
            Some(Value::String(t)) => joined.push_str(t),
            _ => {
                return Err(ApiError::param(
                    &format!("{at}.{field}"),
                    format!("an {kind} part's `{field}` must be a string"),
                ))
            }
        }
    }
    Ok(joined)
}

fn string(obj: &Map<String, Value>, key: &str, at: &str) -> Result<String, ApiError> {
    match obj.get(key) {
        Some(Value::String(s)) if !s.is_empty() || key == "arguments" => Ok(s.clone()),
        _ => Err(ApiError::param(&format!("{at}.{key}"), format!("`{at}.{key}` must be a non-empty string"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_become_chat_messages_with_calls_in_their_assistant_turn() {
        let items = json!([
            {"role": "user", "content": [{"type": "input_text", "text": "Weather "}, {"type": "input_text", "text": "in Oslo?"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Looking."}]},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"},
            {"type": "function_call", "call_id": "call_2", "name": "get_time", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "4C"},
            {"type": "function_call", "call_id": "call_3", "name": "get_time", "arguments": "{}"}
        ]);
        let call = |id: &str, name: &str, args: &str| json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}});
        assert_eq!(
            Value::Array(input(&items).unwrap()),
            json!([
                {"role": "user", "content": "Weather in Oslo?"},
                {"role": "assistant", "content": "Looking.", "tool_calls": [
                    call("call_1", "get_weather", "{\"city\":\"Oslo\"}"), call("call_2", "get_time", "{}")
                ]},
                {"role": "tool", "tool_call_id": "call_1", "content": "4C"},
                {"role": "assistant", "content": null, "tool_calls": [call("call_3", "get_time", "{}")]}
            ])
        );
        assert_eq!(input(&json!("Hi")).unwrap(), vec![json!({"role": "user", "content": "Hi"})]);
    }

    #[test]
    fn reasoning_items_open_their_assistant_turn() {
        let reasoning = |t: &str| json!({"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "not read"}], "content": [{"type": "reasoning_text", "text": t}]});
        let items = json!([
            {"role": "user", "content": "Hi"},
            reasoning("Greet back."),
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello."}]},
            {"role": "user", "content": "Weather?"},
            reasoning("Look it up."),
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"},
            {"type": "reasoning", "id": "rs_3", "summary": []},
            {"type": "reasoning", "summary": [], "encrypted_content": super::super::sealed::seal("Sealed.")},
            {"type": "reasoning", "summary": [], "encrypted_content": "gAAAA-another-servers"},
            {"type": "function_call_output", "call_id": "call_1", "output": "4C"},
            {"type": "reasoning", "summary": [], "encrypted_content": super::super::sealed::seal("Sealed.")}
        ]);
        assert_eq!(
            Value::Array(input(&items).unwrap()),
            json!([
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello.", "reasoning_content": "Greet back."},
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": null, "reasoning_content": "Look it up.Sealed.", "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
                ]},
                {"role": "tool", "tool_call_id": "call_1", "content": "4C"},
                {"role": "assistant", "content": "", "reasoning_content": "Sealed."}
            ])
        );
    }

    #[test]
    fn an_echoed_output_with_text_after_its_calls_is_one_turn_its_results_follow() {
        // A response's output echoed back as input (store: false): the
        // reasoning, a call, the text the model wrote after it, then the
        // call's result. One assistant turn, as the stored conversation
        // keeps it, so the result still answers the turn before it.
        let items = json!([
            {"role": "user", "content": "Weather?"},
            {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "Look."}]},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
            {"type": "function_call_output", "call_id": "call_1", "output": "4C"}
        ]);
        let messages = input(&items).unwrap();
        assert_eq!(
            Value::Array(messages.clone()),
            json!([
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": "Checking.", "reasoning_content": "Look.", "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
                ]},
                {"role": "tool", "tool_call_id": "call_1", "content": "4C"}
            ])
        );
        assert_eq!(host_tools::pair_tool_results(&messages), Ok(()));
    }

    #[test]
    fn contents_and_outputs_take_a_string_or_text_parts_and_name_the_field_otherwise() {
        let parts = json!([{"type": "input_text", "text": "4"}, {"type": "input_text", "text": "C"}]);
        let items = json!([
            {"role": "user", "content": parts},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": parts}
        ]);
        let messages = input(&items).unwrap();
        assert_eq!((&messages[0]["content"], &messages[2]["content"]), (&json!("4C"), &json!("4C")));
        let wrong = |items: Value| input(&items).unwrap_err();
        let e = wrong(json!([{"role": "user", "content": 4}]));
        assert_eq!((e.status.as_u16(), e.param.as_deref()), (400, Some("input[0].content")));
        assert!(e.message.contains("`content` must be a string or an array"), "{}", e.message);
        let e = wrong(json!([{"type": "function_call_output", "call_id": "call_1", "output": {"text": "4C"}}]));
        assert_eq!((e.status.as_u16(), e.param.as_deref()), (400, Some("input[0].output")));
        assert!(e.message.contains("`output` must be a string or an array"), "{}", e.message);
    }
}
