//! A Responses body read into what the engine path takes: `input` (a
//! string, or message, `reasoning`, `function_call` and
//! `function_call_output` items) as chat messages, `instructions`, the flat
//! function tools and `tool_choice` as chat's, `text.format` as a grammar,
//! `reasoning.effort` as the reasoning switch, and the fields the response
//! echoes. Each wrong field is a 400 naming it.

use super::input::input;
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
