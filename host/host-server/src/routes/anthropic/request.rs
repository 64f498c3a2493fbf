//! An Anthropic Messages body read into what the engine path takes: the
//! conversation as OpenAI-shaped messages (`system` first, `tool_use`
//! blocks as assistant `tool_calls`, `thinking` blocks as the assistant's
//! `reasoning_content`, `tool_result` blocks as `tool` messages answering
//! them by id), the tools and `tool_choice` as chat's, `thinking` as the
//! reasoning switch, and the sampling fields. Each wrong field is a 400
//! naming it.

use super::conversation::{messages, system};
use crate::error::ApiError;
use crate::reasoning::Ask;
use crate::structured::Requested;
use crate::tool_plan::tool_error;
use crate::unpaired;
use crate::wire::{Common, Fields};
use host_engine::constraint::Grammar;
use host_tools::{ToolError, ToolRequest};
use serde_json::{json, Map, Value};

pub struct MessagesRequest {
    /// What the chat template renders (`host_tools::template_messages`' output).
    pub messages: Vec<Value>,
    pub tools: ToolRequest,
    /// `output_config.format`: the JSON Schema the answer follows.
    pub format: Option<Requested>,
    pub common: Common,
    /// `thinking` as the reasoning switch.
    pub thinking: Ask,
}

/// `max_tokens` is required to create a message, and not read to count one.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    Create,
    Count,
}

impl MessagesRequest {
    pub fn parse(obj: &Map<String, Value>, purpose: Purpose) -> Result<Self, ApiError> {
        let f = Fields(obj);
        match obj.get("model") {
            Some(Value::String(_)) => {}
            None | Some(Value::Null) => return Err(ApiError::param("model", "`model` is required")),
            Some(_) => return Err(ApiError::param("model", "`model` must be a string")),
        }
        let mut conversation = system(f.value("system"))?;
        conversation.extend(messages(f.value("messages"))?);
        host_tools::pair_tool_results(&conversation).map_err(unpaired::messages)?;
        let messages = host_tools::template_messages(&conversation).map_err(tool_error)?;
        let tools = tools(obj)?;
        if f.value("metadata").is_some_and(|m| !m.is_object()) {
            return Err(ApiError::param("metadata", "`metadata` must be an object"));
        }
        let common = match purpose {
            Purpose::Count => Common { n: 1, ..Default::default() },
            Purpose::Create => sampling(&f)?,
        };
        let format = output_format(f.value("output_config"))?;
        let thinking = thinking(f.value("thinking"), common.max_tokens)?;
        Ok(Self { messages, tools, format, common, thinking })
    }
}

fn sampling(f: &Fields) -> Result<Common, ApiError> {
    let max_tokens =
        f.integer("max_tokens")?.ok_or_else(|| ApiError::param("max_tokens", "`max_tokens` is required"))?;
    let temperature = f.number("temperature")?;
    if temperature.is_some_and(|t| !(0.0..=1.0).contains(&t)) {
        return Err(ApiError::param("temperature", "`temperature` must be between 0 and 1"));
    }
    let stop = match f.value("stop_sequences") {
        None => Vec::new(),
        Some(Value::Array(a)) => {
            let v: Option<Vec<String>> = a.iter().map(|x| x.as_str().map(str::to_owned)).collect();
            v.ok_or_else(|| ApiError::param("stop_sequences", "`stop_sequences` must be an array of strings"))?
        }
        Some(_) => return Err(ApiError::param("stop_sequences", "`stop_sequences` must be an array of strings")),
    };
    if stop.iter().any(|s| s.trim().is_empty()) {
        return Err(ApiError::param("stop_sequences", "each stop sequence must contain non-whitespace"));
    }
    Common {
        max_tokens: Some(max_tokens),
        temperature,
        top_p: f.number("top_p")?,
        top_k: f.integer("top_k")?,
        stop,
        stream: f.boolean("stream")?,
        n: 1,
        ..Default::default()
    }
    .sampling_extensions(f)
}

/// `thinking`: `{type: "enabled", budget_tokens}` (at least 1024 and, to
/// create a message, less than `max_tokens`, as Anthropic checks it),
/// `{type: "adaptive"}` or `{type: "disabled"}`. The budget is checked,
/// not enforced: the model ends its reasoning itself, `max_tokens` caps
/// reasoning and answer together.
fn thinking(v: Option<&Value>, max_tokens: Option<i64>) -> Result<Ask, ApiError> {
    let Some(v) = v else { return Ok(Ask::default()) };
    let o = v.as_object().ok_or_else(|| ApiError::param("thinking", "`thinking` must be an object"))?;
    let enable = match o.get("type").and_then(Value::as_str) {
        Some("enabled") => {
            let budget = match o.get("budget_tokens") {
                Some(Value::Number(n)) if n.as_i64().is_some() => n.as_i64().unwrap_or(0),
                _ => {
                    return Err(ApiError::param(
                        "thinking.budget_tokens",
                        "`thinking.budget_tokens` is required and must be an integer",
                    ))
                }
            };
            if budget < 1024 {
                return Err(ApiError::param(
                    "thinking.budget_tokens",
                    "`thinking.budget_tokens` must be at least 1024",
                ));
            }
            if max_tokens.is_some_and(|m| budget >= m) {
                return Err(ApiError::param(
                    "thinking.budget_tokens",
                    "`thinking.budget_tokens` must be less than `max_tokens`",
                ));
            }
            true
        }
        Some("adaptive") => true,
        Some("disabled") => false,
        _ => {
            return Err(ApiError::param(
                "thinking.type",
                "`thinking.type` must be one of `enabled`, `adaptive`, `disabled`",
            ))
        }
    };
    Ok(Ask { enable: Some(enable), effort: None })
}

/// `output_config`'s `format` (`{"type": "json_schema", "schema"}`);
/// `effort` has no meaning here and is ignored.
fn output_format(v: Option<&Value>) -> Result<Option<Requested>, ApiError> {
    let format = match v {
        None => return Ok(None),
        Some(Value::Object(o)) => match o.get("format") {
            None | Some(Value::Null) => return Ok(None),
            Some(f) => f,
        },
        Some(_) => return Err(ApiError::param("output_config", "`output_config` must be an object")),
    };
    let p = "output_config.format";
    if format.get("type").and_then(Value::as_str) != Some("json_schema") {
        return Err(ApiError::param(p, "`output_config.format.type` must be `json_schema`"));
    }
    match format.get("schema") {
        Some(s @ Value::Object(_)) => Ok(Some(Requested { grammar: Grammar::JsonSchema(s.clone()), param: p.into() })),
        _ => Err(ApiError::param(p, "`output_config.format.schema` must be a JSON Schema object")),
    }
}

/// `tools` (`{name, description, input_schema}`) and `tool_choice` (`auto`,
/// `any`, `tool`, `none`) read by chat's rules; errors name Anthropic's fields.
fn tools(obj: &Map<String, Value>) -> Result<ToolRequest, ApiError> {
    let tools = match obj.get("tools") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => {
            items.iter().enumerate().map(|(i, t)| function_tool(t, &format!("tools[{i}]"))).collect::<Result<_, _>>()?
        }
        Some(_) => return Err(ApiError::param("tools", "`tools` must be an array")),
    };
    let (choice, parallel) = match obj.get("tool_choice") {
        None | Some(Value::Null) => (Value::Null, true),
        Some(Value::Object(c)) => {
            let parallel = match c.get("disable_parallel_tool_use") {
                None | Some(Value::Null) => true,
                Some(Value::Bool(b)) => !b,
                Some(_) => {
                    return Err(ApiError::param(
                        "tool_choice.disable_parallel_tool_use",
                        "`disable_parallel_tool_use` must be true or false",
                    ))
                }
            };
            let choice = match c.get("type").and_then(Value::as_str) {
                Some("auto") => json!("auto"),
                Some("any") => json!("required"),
                Some("none") => json!("none"),
                Some("tool") => match c.get("name") {
                    Some(Value::String(n)) => json!({ "type": "function", "function": { "name": n } }),
                    _ => return Err(ApiError::param("tool_choice.name", "`tool_choice.name` must be a string")),
                },
                _ => {
                    return Err(ApiError::param(
                        "tool_choice.type",
                        "`tool_choice.type` must be one of `auto`, `any`, `tool`, `none`",
                    ))
                }
            };
            (choice, parallel)
        }
        Some(_) => return Err(ApiError::param("tool_choice", "`tool_choice` must be an object")),
    };
    let body = json!({ "tools": tools, "tool_choice": choice, "parallel_tool_calls": parallel });
    ToolRequest::from_body(&body).map_err(|e| tool_error(anthropic_names(e)))
}

/// One Anthropic tool as chat's function tool.
fn function_tool(t: &Value, at: &str) -> Result<Value, ApiError> {
    let obj = t.as_object().ok_or_else(|| ApiError::param(at, format!("`{at}` must be an object")))?;
    match obj.get("type").and_then(Value::as_str) {
        None | Some("custom") => {}
        Some(other) => {
            return Err(ApiError::unsupported(
                &format!("{at}.type"),
                format!("tools of type '{other}' are not supported (only client tools with an `input_schema`)"),
            ))
        }
    }
    let schema = obj
        .get("input_schema")
        .ok_or_else(|| ApiError::param(&format!("{at}.input_schema"), format!("`{at}.input_schema` is required")))?;
    let mut function = Map::new();
    for k in ["name", "description"] {
        if let Some(v) = obj.get(k) {
            function.insert(k.into(), v.clone());
        }
    }
    function.insert("parameters".into(), schema.clone());
    Ok(json!({ "type": "function", "function": function }))
}

/// Chat's parameter names in a tool error, as Anthropic's fields.
fn anthropic_names(mut e: ToolError) -> ToolError {
    for (chat, ours) in
        [(".function.parameters", ".input_schema"), (".function.", "."), ("tool_choice.function.", "tool_choice.")]
    {
        e.param = e.param.replace(chat, ours);
    }
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: Value) -> Result<MessagesRequest, ApiError> {
        MessagesRequest::parse(body.as_object().unwrap(), Purpose::Create)
    }

    #[test]
    fn a_tool_conversation_becomes_chat_messages() {
        let body = json!({
            "model": "m", "max_tokens": 5, "system": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}],
            "messages": [
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Looking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "4C"}]},
                    {"type": "text", "text": "And "}, {"type": "text", "text": "tomorrow?"}
                ]}
            ],
            "stop_sequences": ["END"], "temperature": 0.5, "top_k": 3,
            "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true}
        });
        let r = parse(body).unwrap();
        assert_eq!(
            Value::Array(r.messages),
            json!([
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": "Looking.", "tool_calls": [
                    {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}
                ]},
                {"role": "tool", "tool_call_id": "toolu_1", "content": "4C", "name": "get_weather"},
                {"role": "user", "content": "And tomorrow?"}
            ])
        );
        assert_eq!(r.tools.choice, host_tools::ToolChoice::Required);
        assert!(!r.tools.parallel);
        assert_eq!(
            (r.common.max_tokens, r.common.top_k, r.common.stop.clone()),
            (Some(5), Some(3), vec!["END".into()])
        );
    }

    #[test]
    fn thinking_blocks_are_the_turns_reasoning_and_thinking_the_switch() {
        let body = json!({
            "model": "m", "max_tokens": 2000, "thinking": {"type": "enabled", "budget_tokens": 1024},
            "messages": [
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "Look it ", "signature": "s"},
                    {"type": "redacted_thinking", "data": "opaque"},
                    {"type": "thinking", "thinking": "up.", "signature": "s"},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}
                ]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "4C"}]},
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "Done.", "signature": "s"}]},
                {"role": "user", "content": "Thanks"}
            ]
        });
        let r = parse(body).unwrap();
        assert_eq!(r.messages[1]["reasoning_content"], "Look it up.");
        assert_eq!(r.messages[1]["content"], Value::Null);
        assert_eq!(r.messages[3], json!({"role": "assistant", "content": "", "reasoning_content": "Done."}));
        assert_eq!(r.thinking.enable, Some(true));
        let off = |t: Value| {
            parse(json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "thinking": t}))
        };
        assert_eq!(off(json!({"type": "disabled"})).unwrap().thinking.enable, Some(false));
        assert_eq!(off(json!({"type": "adaptive"})).unwrap().thinking.enable, Some(true));
    }

    #[test]
    fn consecutive_turns_of_one_role_are_one_turn() {
        let body = json!({
            "model": "m", "max_tokens": 5,
            "messages": [
                {"role": "user", "content": "Weather?"},
                {"role": "user", "content": [{"type": "text", "text": "In Oslo."}]},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get_weather", "input": {}}]},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "And the time.", "signature": "s"},
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "t2", "name": "get_time", "input": {}}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": "4C"},
                    {"type": "tool_result", "tool_use_id": "t2", "content": "noon"},
                    {"type": "text", "text": "Thanks."}
                ]},
                {"role": "user", "content": "And tomorrow?"}
            ]
        });
        let r = parse(body).unwrap();
        let call =
            |id: &str, name: &str| json!({"id": id, "type": "function", "function": {"name": name, "arguments": {}}});
        assert_eq!(
            Value::Array(r.messages),
            json!([
                {"role": "user", "content": "Weather?\n\nIn Oslo."},
                {"role": "assistant", "content": "Checking.", "reasoning_content": "And the time.",
                 "tool_calls": [call("t1", "get_weather"), call("t2", "get_time")]},
                {"role": "tool", "tool_call_id": "t1", "content": "4C", "name": "get_weather"},
                {"role": "tool", "tool_call_id": "t2", "content": "noon", "name": "get_time"},
                {"role": "user", "content": "Thanks.\n\nAnd tomorrow?"}
            ])
        );
    }

    #[test]
    fn tool_errors_name_anthropic_fields() {
        let base = |tools: Value, choice: Value| json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "tools": tools, "tool_choice": choice});
        let cases = [
            (base(json!([{"name": "f", "input_schema": {"type": "array"}}]), Value::Null), "tools[0].input_schema"),
            (base(json!([{"name": "a b", "input_schema": {}}]), Value::Null), "tools[0].name"),
            (base(json!([{"name": "f", "input_schema": {}}]), json!({"type": "tool"})), "tool_choice.name"),
            (base(json!([{"name": "f", "input_schema": {}}]), json!({"type": "tool", "name": "g"})), "tool_choice"),
        ];
        for (body, param) in cases {
            assert_eq!(parse(body.clone()).err().and_then(|e| e.param).as_deref(), Some(param), "{body}");
        }
    }
}
