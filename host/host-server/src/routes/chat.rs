//! `POST /v1/chat/completions`: messages (tool calls and results
//! included) through the model's chat template; plain text, structured
//! output, or tool calls back, and the model's reasoning apart
//! (`reasoning_content`).

use super::{json_object, top_count};
use crate::error::ApiError;
use crate::gen;
use crate::prompt;
use crate::reasoning;
use crate::respond::{self, Api, Ctx};
use crate::state::{unix_now, AppState};
use crate::structured;
use crate::tool_plan::{choice_out, plan_tools, tool_error};
use crate::unpaired;
use crate::wire::{Common, Fields};
use axum::body::Bytes;
use axum::extract::State;
use axum::response::Response;
use host_tools::ToolRequest;
use serde_json::Value;

pub async fn handler(State(st): State<AppState>, body: Bytes) -> Result<Response, ApiError> {
    let obj = json_object(&body)?;
    let f = Fields(&obj);
    let messages = match f.value("messages") {
        None => return Err(ApiError::param("messages", "`messages` is required")),
        Some(Value::Array(a)) if a.is_empty() => {
            return Err(ApiError::param("messages", "`messages` must not be empty"))
        }
        Some(Value::Array(a)) => a,
        Some(_) => return Err(ApiError::param("messages", "`messages` must be an array")),
    };
    let normalized = host_tools::template_messages(messages).map_err(tool_error)?;
    host_tools::pair_tool_results(&normalized).map_err(unpaired::chat)?;
    let tools = ToolRequest::from_body(&Value::Object(obj.clone())).map_err(tool_error)?;
    let common = Common::parse(&f, "max_tokens")?;
    let wants = f.boolean("logprobs")?;
    let top = top_count(f.value("top_logprobs"), 20, "top_logprobs")?;
    if top.is_some() && !wants {
        return Err(ApiError::param("top_logprobs", "`top_logprobs` requires `logprobs: true`"));
    }
    let logprobs = wants.then(|| top.unwrap_or(0));
    let kwargs = match f.value("chat_template_kwargs") {
        None => serde_json::Map::new(),
        Some(Value::Object(o)) => o.clone(),
        Some(_) => return Err(ApiError::param("chat_template_kwargs", "`chat_template_kwargs` must be an object")),
    };
    // The template sees the tools as the client sent them (HF templates
    // take OpenAI's function-tool objects).
    let template_tools = (!tools.tools.is_empty()).then(|| f.value("tools").cloned().unwrap_or(Value::Null));
    let ask = reasoning::Ask {
        enable: None,
        effort: reasoning::Ask::effort(f.value("reasoning_effort"), "reasoning_effort")?,
    };
    let rendered = prompt::render(&st, normalized, template_tools, kwargs, &ask)?;
    let (text, prompt, thinking) = (rendered.text, rendered.prompt, rendered.reasoning);
    let (grammar, syntax) = plan_tools(&st, &tools, structured::requested(&f)?)?;
    let gate = thinking.as_ref().and_then(reasoning::Plan::gate);
    let reqs = gen::requests(&st, &common, prompt, logprobs, grammar.as_ref(), gate)?;
    let id = st.next_id("chatcmpl");
    let runs = gen::submit_all(&st, &id, reqs)?
        .into_iter()
        .enumerate()
        .map(|(i, run)| {
            (run, choice_out(i, text.clone(), common.stop.clone(), syntax, &tools.tools, thinking.as_ref()))
        })
        .collect();
    let ctx = Ctx {
        st: st.clone(),
        api: Api::Chat,
        id,
        created: unix_now(),
        logprobs,
        include_usage: common.include_usage,
        per_prompt: common.n,
    };
    if common.stream {
        Ok(respond::stream(ctx, runs))
    } else {
        respond::complete(ctx, runs).await
    }
}
