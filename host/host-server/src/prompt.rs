//! A conversation through the model's chat template into prompt tokens:
//! what the chat, Anthropic and Responses endpoints share once each has
//! turned its own wire format into OpenAI-shaped messages
//! (`host_tools::template_messages`' output) and function tools.

use crate::error::ApiError;
use crate::reasoning;
use crate::state::AppState;
use host_engine::tokenizer::TextSide;
use host_tools::Tool;
use serde_json::{json, Map, Value};
use std::sync::Arc;

/// A rendered prompt and the text side that made it (it also decodes the
/// answer), and where the answer starts if the model reasons.
pub struct Rendered {
    pub text: Arc<TextSide>,
    pub prompt: Vec<u32>,
    pub reasoning: Option<reasoning::Plan>,
}

/// Renders `messages` with the generation prompt; `tools` (OpenAI's
/// function-tool objects, which HF templates take) go to the template as
/// its `tools` variable, and the request's reasoning switch as the
/// variables the template reads (`reasoning::template_kwargs`). System
/// messages go through `--system-prompt-rule`s first.
pub fn render(
    st: &AppState,
    mut messages: Vec<Value>,
    tools: Option<Value>,
    mut kwargs: Map<String, Value>,
    ask: &reasoning::Ask,
) -> Result<Rendered, ApiError> {
    let text = st
        .text
        .clone()
        .ok_or_else(|| ApiError::invalid("this model has no tokenizer: use /v1/completions with token ids"))?;
    let template = text
        .template
        .as_ref()
        .ok_or_else(|| ApiError::invalid("this model has no chat template: use /v1/completions"))?;
    if let Some(t) = tools {
        kwargs.insert("tools".into(), t);
    }
    reasoning::template_kwargs(&st.reasoning, st.cfg.thinking, st.cfg.preserve_thinking, ask, &mut kwargs);
    st.cfg.system_rules.apply_to_system(&mut messages);
    if !st.tools.template_renders_calls {
        host_tools::inline_calls(&mut messages, st.tools.syntax);
    }
    let rendered = template
        .render(&Value::Array(messages), true, &kwargs)
        .map_err(|e| ApiError::param("messages", e.to_string()))?;
    let prompt = text.encode_rendered(&rendered).map_err(|e| ApiError::invalid(e.to_string()))?;
    let reasoning = reasoning::Plan::of(&st.reasoning, &rendered);
    Ok(Rendered { text, prompt, reasoning })
}

/// Parsed tools as OpenAI's function-tool objects, for a template (APIs
/// whose tools have another shape render them as chat's).
pub fn function_tools(tools: &[Tool]) -> Option<Value> {
    if tools.is_empty() {
        return None;
    }
    let each = tools.iter().map(|t| {
        let mut f = json!({ "name": t.name, "parameters": t.parameters });
        if let Some(d) = &t.description {
            f["description"] = json!(d);
        }
        json!({ "type": "function", "function": f })
    });
    Some(Value::Array(each.collect()))
}
