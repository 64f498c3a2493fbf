//! A Messages conversation as OpenAI-shaped chat messages: `system` first,
//! `tool_use` blocks as assistant `tool_calls`, `thinking` blocks as the
//! assistant's `reasoning_content`, `tool_result` blocks as `tool` messages
//! answering them by id, and consecutive turns of one role as one turn.
//! Each wrong block is a 400 naming it.

use crate::assistant_turn::{into_messages, AssistantTurn, Turn};
use crate::error::ApiError;
use serde_json::{json, Value};

/// `system`: a string or an array of text blocks.
pub(super) fn system(v: Option<&Value>) -> Result<Vec<Value>, ApiError> {
    let text = match v {
        None => return Ok(Vec::new()),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(blocks)) => text_blocks(blocks, "system", "system")?,
        Some(_) => return Err(ApiError::param("system", "`system` must be a string or an array of text blocks")),
    };
    Ok(if text.is_empty() { Vec::new() } else { vec![json!({ "role": "system", "content": text })] })
}

pub(super) fn messages(v: Option<&Value>) -> Result<Vec<Value>, ApiError> {
    let items = match v {
        None => return Err(ApiError::param("messages", "`messages` is required")),
        Some(Value::Array(a)) if a.is_empty() => {
            return Err(ApiError::param("messages", "`messages` must hold at least one message"))
        }
        Some(Value::Array(a)) => a,
        Some(_) => return Err(ApiError::param("messages", "`messages` must be an array")),
    };
    let mut out = Vec::new();
    for (i, m) in items.iter().enumerate() {
        let at = format!("messages[{i}]");
        let obj = m.as_object().ok_or_else(|| ApiError::param(&at, format!("`{at}` must be an object")))?;
        let content = obj
            .get("content")
            .ok_or_else(|| ApiError::param(&format!("{at}.content"), format!("`{at}.content` is required")))?;
        match obj.get("role").and_then(Value::as_str) {
            Some("user") => out.extend(user(content, &at)?.into_iter().map(Turn::Message)),
            Some("assistant") if i + 1 == items.len() => {
                return Err(ApiError::unsupported(
                    &format!("{at}.role"),
                    "a final assistant message (prefill) is not supported: the answer is always a new turn",
                ))
            }
            Some("assistant") => out.push(Turn::Assistant(assistant(content, &at)?)),
            Some(other) => {
                return Err(ApiError::param(
                    &format!("{at}.role"),
                    format!(
                    "unknown role '{other}': messages are from `user` or `assistant` (`system` is a top-level field)"
                ),
                ))
            }
            None => return Err(ApiError::param(&format!("{at}.role"), format!("`{at}.role` must be a string"))),
        }
    }
    Ok(into_messages(merge_turns(out)))
}

/// Consecutive turns of one role as one turn, as Anthropic combines them:
/// texts joined by a blank line, an assistant's calls and reasoning in
/// order. Tool results stay apart (each answers its own call), so a user
/// turn's text after its results still joins the next user turn.
fn merge_turns(turns: Vec<Turn>) -> Vec<Turn> {
    let mut out: Vec<Turn> = Vec::with_capacity(turns.len());
    for t in turns {
        match (out.last_mut(), t) {
            (Some(Turn::Assistant(last)), Turn::Assistant(next)) => last.absorb(next, "\n\n"),
            (Some(Turn::Message(last)), Turn::Message(next)) if last["role"] == "user" && next["role"] == "user" => {
                let (a, b) =
                    (last["content"].as_str().unwrap_or_default(), next["content"].as_str().unwrap_or_default());
                let joined = if a.is_empty() || b.is_empty() { format!("{a}{b}") } else { format!("{a}\n\n{b}") };
                last["content"] = json!(joined);
            }
            (_, t) => out.push(t),
        }
    }
    out
}

/// A user turn: its text blocks as one user message, each `tool_result`
/// as a tool message, in the order given.
fn user(content: &Value, at: &str) -> Result<Vec<Value>, ApiError> {
    let blocks = match content {
        Value::String(s) => return Ok(vec![json!({ "role": "user", "content": s })]),
        Value::Array(b) => b,
        _ => return Err(content_type_error(at)),
    };
    let mut out = Vec::new();
    let mut text: Option<String> = None;
    for (k, b) in blocks.iter().enumerate() {
        let at = format!("{at}.content[{k}]");
        match block_type(b, &at)? {
            "text" => text.get_or_insert_with(String::new).push_str(block_text(b, &at)?),
            "tool_result" => {
                if let Some(t) = text.take() {
                    out.push(json!({ "role": "user", "content": t }));
                }
                out.push(tool_result(b, &at)?);
            }
            other => return Err(ApiError::param(&format!("{at}.type"), unsupported_block(other, "user"))),
        }
    }
    if let Some(t) = text {
        out.push(json!({ "role": "user", "content": t }));
    }
    if out.is_empty() {
        return Err(ApiError::param(&format!("{at}.content"), "a user message needs at least one content block"));
    }
    Ok(out)
}

fn tool_result(b: &Value, at: &str) -> Result<Value, ApiError> {
    let id = match b.get("tool_use_id") {
        Some(Value::String(id)) if !id.is_empty() => id,
        _ => return Err(ApiError::param(&format!("{at}.tool_use_id"), "`tool_use_id` must be a non-empty string")),
    };
    let content = match b.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => text_blocks(parts, &format!("{at}.content"), "tool_result")?,
        Some(_) => {
            return Err(ApiError::param(
                &format!("{at}.content"),
                "a tool result's `content` must be a string or an array of text blocks",
            ))
        }
    };
    if b.get("is_error").is_some_and(|e| !e.is_boolean() && !e.is_null()) {
        return Err(ApiError::param(&format!("{at}.is_error"), "`is_error` must be true or false"));
    }
    Ok(json!({ "role": "tool", "tool_call_id": id, "content": content }))
}

/// An assistant turn: its text and its `tool_use` blocks as one message
/// with `tool_calls`.
fn assistant(content: &Value, at: &str) -> Result<AssistantTurn, ApiError> {
    let mut turn = AssistantTurn::default();
    let blocks = match content {
        Value::String(s) => {
            turn.push_text(s, "");
            return Ok(turn);
        }
        Value::Array(b) => b,
        _ => return Err(content_type_error(at)),
    };
    for (k, b) in blocks.iter().enumerate() {
        let at = format!("{at}.content[{k}]");
        match block_type(b, &at)? {
            "text" => turn.push_text(block_text(b, &at)?, ""),
            "tool_use" => {
                let (id, name, input) = tool_use(b, &at)?;
                turn.push_call(id, name, input);
            }
            "thinking" => match b.get("thinking") {
                Some(Value::String(t)) => turn.push_reasoning(t),
                _ => {
                    return Err(ApiError::param(
                        &format!("{at}.thinking"),
                        "a thinking block's `thinking` must be a string",
                    ))
                }
            },
            // Reasoning we cannot read: nothing to show the template.
            "redacted_thinking" => {}
            other => return Err(ApiError::param(&format!("{at}.type"), unsupported_block(other, "assistant"))),
        }
    }
    if turn.is_empty() {
        return Err(ApiError::param(&format!("{at}.content"), "an assistant message needs at least one content block"));
    }
    Ok(turn)
}

/// A `tool_use` block's id, name and input.
fn tool_use(b: &Value, at: &str) -> Result<(Value, Value, Value), ApiError> {
    let field = |k: &str| match b.get(k) {
        Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
        _ => Err(ApiError::param(&format!("{at}.{k}"), format!("`{k}` must be a non-empty string"))),
    };
    let (id, name) = (field("id")?, field("name")?);
    let input = match b.get("input") {
        Some(v @ Value::Object(_)) => v.clone(),
        _ => return Err(ApiError::param(&format!("{at}.input"), "`input` must be an object")),
    };
    Ok((id.into(), name.into(), input))
}

/// Text blocks (at `at[i]`) joined; any other block in `place` is refused.
fn text_blocks(blocks: &[Value], at: &str, place: &str) -> Result<String, ApiError> {
    let mut joined = String::new();
    for (i, b) in blocks.iter().enumerate() {
        let at = format!("{at}[{i}]");
        match block_type(b, &at)? {
            "text" => joined.push_str(block_text(b, &at)?),
            other => return Err(ApiError::param(&format!("{at}.type"), unsupported_block(other, place))),
        }
    }
    Ok(joined)
}

fn block_type<'a>(b: &'a Value, at: &str) -> Result<&'a str, ApiError> {
    if !b.is_object() {
        return Err(ApiError::param(at, format!("`{at}` must be a content block object")));
    }
    b.get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::param(&format!("{at}.type"), format!("`{at}.type` is required and must be a string")))
}

fn block_text<'a>(b: &'a Value, at: &str) -> Result<&'a str, ApiError> {
    b.get("text")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::param(&format!("{at}.text"), "a text block's `text` must be a string".to_string()))
}

fn content_type_error(at: &str) -> ApiError {
    ApiError::param(&format!("{at}.content"), "`content` must be a string or an array of content blocks")
}

/// Why a block of this type cannot be taken where it is.
fn unsupported_block(kind: &str, place: &str) -> String {
    const KNOWN: &[&str] =
        &["image", "document", "search_result", "server_tool_use", "web_search_tool_result", "container_upload"];
    match kind {
        "text" | "tool_use" | "tool_result" | "thinking" | "redacted_thinking" => {
            // ("an assistant", "a user")
            let article = if place.starts_with(['a', 'e', 'i', 'o']) { "an" } else { "a" };
            format!("a `{kind}` block cannot appear in {article} {place} message")
        }
        k if KNOWN.contains(&k) => format!("content blocks of type '{k}' are not supported"),
        k => format!("unknown content block type '{k}'"),
    }
}
