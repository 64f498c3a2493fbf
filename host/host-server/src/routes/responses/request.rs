//! A Responses body read into what the engine path takes: `input` (a
//! string, or message, `reasoning`, `function_call` and
//! `function_call_output` items) as chat messages, `instructions`, the flat
//! function tools and `tool_choice` as chat's, `text.format` as a grammar,
//! `reasoning.effort` as the reasoning switch, and the fields the response
//! echoes. Each wrong field is a 400 naming it.

use crate::assistant_turn::{into_messages, AssistantTurn, Turn};
use crate::error::ApiError;
use crate::reasoning::Ask;
use crate::structured::{self, Requested};
use crate::tool_plan::tool_error;
use crate::wire::{Common, Fields};
use host_tools::{ToolError, ToolRequest};
use serde_json::{json, Map, Value};

pub struct CreateRequest {
    /// This request's input as chat messages (not yet checked by
    /// `template_messages`: a stored conversation is joined first).
    pub input: Vec<Value>,
    pub instructions: Option<String>,
    pub tools: ToolRequest,
    pub format: Option<Requested>,
    pub common: Common,
    pub previous_response_id: Option<String>,
    pub store: bool,
    /// `reasoning.effort` as the reasoning switch.
    pub thinking: Ask,
    /// `include` asks for reasoning items' `encrypted_content`.
    pub seal_reasoning: bool,
    /// What the response repeats of the request.
    pub echo: Echo,
}

/// Request fields a response object repeats.
pub struct Echo {
    pub instructions: Value,
    pub max_output_tokens: Value,
    pub metadata: Value,
    pub parallel_tool_calls: bool,
    pub temperature: Value,
    pub top_p: Value,
    pub text: Value,
    pub tool_choice: Value,
    pub tools: Value,
    pub truncation: Value,
    pub reasoning: Value,
}

impl CreateRequest {
    pub fn parse(obj: &Map<String, Value>) -> Result<Self, ApiError> {
        let f = Fields(obj);
        if obj.get("model").is_some_and(|m| !m.is_string() && !m.is_null()) {
            return Err(ApiError::param("model", "`model` must be a string"));
        }
        let previous_response_id = match f.value("previous_response_id") {
            None => None,
            Some(Value::String(id)) if !id.is_empty() => Some(id.clone()),
            Some(_) => {
                return Err(ApiError::param(
                    "previous_response_id",
                    "`previous_response_id` must be a non-empty string",
                ))
            }
        };
        let input = match f.value("input") {
            None if previous_response_id.is_some() => Vec::new(),
            None => return Err(ApiError::param("input", "`input` is required")),
            Some(v) => input(v)?,
        };
        let instructions = match f.value("instructions") {
            None => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => return Err(ApiError::param("instructions", "`instructions` must be a string")),
        };
        for (key, why) in [
            ("background", "background responses are not supported"),
            ("conversation", "conversations are not supported (use previous_response_id)"),
            ("prompt", "stored prompt templates are not supported"),
        ] {
            if f.value(key).is_some_and(|v| v != &Value::Bool(false)) {
                return Err(ApiError::unsupported(key, why));
            }
        }
        if f.integer("top_logprobs")?.is_some_and(|n| n != 0) {
            return Err(ApiError::unsupported("top_logprobs", "logprobs are not supported on /v1/responses"));
        }
        let truncation = match f.value("truncation") {
            None => json!("disabled"),
            Some(t @ Value::String(s)) if s == "auto" || s == "disabled" => t.clone(),
            Some(_) => return Err(ApiError::param("truncation", "`truncation` must be `auto` or `disabled`")),
        };
        let metadata = match f.value("metadata") {
            None => json!({}),
            Some(m @ Value::Object(o)) if o.values().all(Value::is_string) => m.clone(),
            Some(_) => return Err(ApiError::param("metadata", "`metadata` must be an object of strings")),
        };
        let (tools, tools_echo) = tools(obj)?;
        let format = structured::text_format(f.value("text"))?;
        let max_output_tokens = f.integer("max_output_tokens")?;
        let common = Common {
            max_tokens: max_output_tokens,
            temperature: f.number("temperature")?,
            top_p: f.number("top_p")?,
            stream: f.boolean("stream")?,
            n: 1,
            ..Default::default()
        }
        .sampling_extensions(&f)?;
        let effort = match f.value("reasoning") {
            None => None,
            Some(Value::Object(r)) => Ask::effort(r.get("effort"), "reasoning.effort")?,
            Some(_) => return Err(ApiError::param("reasoning", "`reasoning` must be an object")),
        };
        let reasoning = json!({ "effort": effort, "summary": null });
        let thinking = Ask { enable: None, effort };
        let seal_reasoning = match f.value("include") {
            None => false,
            Some(Value::Array(a)) if a.iter().all(Value::is_string) => {
                a.iter().any(|v| v == "reasoning.encrypted_content")
            }
            Some(_) => return Err(ApiError::param("include", "`include` must be an array of strings")),
        };
        let store = match f.value("store") {
            None => true,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(ApiError::param("store", "`store` must be true or false")),
        };
        let echo = Echo {
            instructions: instructions.clone().map_or(Value::Null, Value::String),
            max_output_tokens: max_output_tokens.map_or(Value::Null, |n| json!(n)),
            metadata,
            parallel_tool_calls: tools.parallel,
            temperature: common.temperature.map_or(Value::Null, |t| json!(t)),
            top_p: common.top_p.map_or(Value::Null, |t| json!(t)),
            text: json!({ "format": f.value("text").and_then(|t| t.get("format")).cloned().unwrap_or(json!({ "type": "text" })) }),
            tool_choice: f.value("tool_choice").cloned().unwrap_or(json!("auto")),
            tools: tools_echo,
            truncation,
            reasoning,
        };
        Ok(Self {
            input,
            instructions,
            tools,
            format,
            common,
            previous_response_id,
            store,
            thinking,
            seal_reasoning,
            echo,
        })
    }
}

/// `input`: a string (one user message) or an array of items.
fn input(v: &Value) -> Result<Vec<Value>, ApiError> {
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
                match out.last_mut() {
                    // The answer after its reasoning item joins that turn;
                    // text written after the turn's calls (a response's
                    // output echoed back) stays in it too, as the stored
                    // conversation keeps it, so its results still follow it.
                    Some(Turn::Assistant(last))
                        if role == "assistant" && (last.reasoning_alone() || last.has_calls()) =>
                    {
                        last.push_text(&text, "")
                    }
                    _ if role == "assistant" => {
                        let mut turn = AssistantTurn::default();
                        turn.push_text(&text, "");
                        out.push(Turn::Assistant(turn));
                    }
                    _ => out.push(Turn::Message(json!({ "role": role, "content": text }))),
                }
            }
            Some("reasoning") => {
                // A turn's reasoning opens that assistant turn; its answer
                // and calls join it. Reasoning after the turn's calls (and
                // before their results) is still that turn's.
                let text = reasoning_text(obj, &at)?;
                match out.last_mut() {
                    Some(Turn::Assistant(last)) if last.has_calls() => last.push_reasoning(&text),
                    _ => {
                        let mut turn = AssistantTurn::default();
                        turn.push_reasoning(&text);
                        out.push(Turn::Assistant(turn));
                    }
                }
            }
            Some("function_call") => {
                let arguments = string(obj, "arguments", &at)?;
                if !serde_json::from_str::<Value>(&arguments).is_ok_and(|a| a.is_object()) {
                    return Err(ApiError::param(
                        &format!("{at}.arguments"),
                        "`arguments` must be a string holding a JSON object",
                    ));
                }
                let call = json!({
                    "id": string(obj, "call_id", &at)?,
                    "type": "function",
                    "function": { "name": string(obj, "name", &at)?, "arguments": arguments },
                });
                // Calls after an assistant message (or after each other)
                // belong to that assistant turn, as the model wrote them.
                match out.last_mut() {
                    Some(Turn::Assistant(last)) => last.push_call(call),
                    _ => {
                        let mut turn = AssistantTurn::default();
                        turn.push_call(call);
                        out.push(Turn::Assistant(turn));
                    }
                }
            }
            Some("function_call_output") => {
                let output = match obj.get("output") {
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Array(parts)) => text_parts(parts, &format!("{at}.output"))?,
                    _ => {
                        return Err(ApiError::param(
                            &format!("{at}.output"),
                            "`output` must be a string or an array of input_text parts",
                        ))
                    }
                };
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
    let content = match obj.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => text_parts(parts, &format!("{at}.content"))?,
        _ => {
            return Err(ApiError::param(
                &format!("{at}.content"),
                "`content` must be a string or an array of content parts",
            ))
        }
    };
    Ok((role, content))
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

/// The flat function tools (`{type: "function", name, description,
/// parameters, strict}`) and `tool_choice` read by chat's rules; errors
/// name the Responses fields. Also the tools as the response echoes them.
fn tools(obj: &Map<String, Value>) -> Result<(ToolRequest, Value), ApiError> {
    let (chat_tools, echo) = match obj.get("tools") {
        None | Some(Value::Null) => (Vec::new(), Vec::new()),
        Some(Value::Array(items)) => {
            let mut chat = Vec::with_capacity(items.len());
            for (i, t) in items.iter().enumerate() {
                let at = format!("tools[{i}]");
                let o = t.as_object().ok_or_else(|| ApiError::param(&at, format!("`{at}` must be an object")))?;
                match o.get("type").and_then(Value::as_str) {
                    Some("function") => {}
                    Some(other) => {
                        return Err(ApiError::unsupported(
                            &format!("{at}.type"),
                            format!("tools of type '{other}' are not supported (only `function`)"),
                        ))
                    }
                    None => return Err(ApiError::param(&format!("{at}.type"), format!("`{at}.type` is required"))),
                }
                let mut function = o.clone();
                function.remove("type");
                chat.push(json!({ "type": "function", "function": function }));
            }
            (chat, items.clone())
        }
        Some(_) => return Err(ApiError::param("tools", "`tools` must be an array")),
    };
    let choice = match obj.get("tool_choice") {
        None | Some(Value::Null) => Value::Null,
        Some(s @ Value::String(_)) => s.clone(),
        Some(Value::Object(c)) => match c.get("type").and_then(Value::as_str) {
            Some("function") => {
                json!({ "type": "function", "function": { "name": c.get("name").cloned().unwrap_or(Value::Null) } })
            }
            Some(other) => {
                return Err(ApiError::unsupported(
                    "tool_choice.type",
                    format!(
                        "tool_choice of type '{other}' is not supported (`auto`, `none`, `required` or a function)"
                    ),
                ))
            }
            None => return Err(ApiError::param("tool_choice.type", "`tool_choice.type` is required")),
        },
        Some(_) => return Err(ApiError::param("tool_choice", "`tool_choice` must be a string or an object")),
    };
    let body = json!({
        "tools": chat_tools,
        "tool_choice": choice,
        "parallel_tool_calls": obj.get("parallel_tool_calls").cloned().unwrap_or(Value::Null),
    });
    let request = ToolRequest::from_body(&body).map_err(|e| tool_error(responses_names(e)))?;
    Ok((request, Value::Array(echo)))
}

/// Chat's parameter names in a tool error, as the Responses fields.
fn responses_names(mut e: ToolError) -> ToolError {
    e.param = e.param.replace(".function.", ".");
    e
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
    fn flat_tools_read_as_chat_tools_and_echo_as_sent() {
        let body = json!({
            "tools": [{"type": "function", "name": "f", "description": "d", "parameters": {"type": "object"}, "strict": true}],
            "tool_choice": {"type": "function", "name": "f"}, "parallel_tool_calls": false
        });
        let (req, echo) = tools(body.as_object().unwrap()).unwrap();
        assert_eq!(req.tools[0].name, "f");
        assert!(req.tools[0].strict);
        assert_eq!(req.choice, host_tools::ToolChoice::Named("f".into()));
        assert!(!req.parallel);
        assert_eq!(echo, body["tools"]);
    }
}
