//! Anthropic's Messages API: `POST /v1/messages` and
//! `POST /v1/messages/count_tokens`, over the engine path chat takes (the
//! chat template with tools, one plan per request, batching, the prefix
//! cache, calls forced under a grammar). Every error leaves in
//! Anthropic's shape.

mod conversation;
mod reply;
mod request;

use super::json_object;
use crate::answer::{new_id, Answer};
use crate::error::AnthropicError;
use crate::gen;
use crate::prompt::{self, Rendered};
use crate::state::AppState;
use crate::tool_plan::{choice_out, plan_tools};
use axum::body::Bytes;
use axum::extract::State;
use axum::response::Response;
use axum::Json;
use request::{MessagesRequest, Purpose};
use serde_json::{json, Map, Value};

fn rendered(st: &AppState, req: &MessagesRequest) -> Result<Rendered, AnthropicError> {
    let tools = prompt::function_tools(&req.tools.tools);
    Ok(prompt::render(st, req.messages.clone(), tools, Map::new(), &req.thinking)?)
}

pub async fn create(State(st): State<AppState>, body: Bytes) -> Result<Response, AnthropicError> {
    let obj = json_object(&body)?;
    let req = MessagesRequest::parse(&obj, Purpose::Create)?;
    let Rendered { text, prompt, reasoning } = rendered(&st, &req)?;
    let (grammar, syntax) = plan_tools(&st, &req.tools, req.format.clone())?;
    let common = &req.common;
    let gate = reasoning.as_ref().and_then(crate::reasoning::Plan::gate);
    let engine_req = gen::requests(&st, common, prompt, None, grammar.as_ref(), gate)?.remove(0);
    let id = new_id("msg");
    let run = gen::submit(&st, &id, engine_req)?;
    let out = choice_out(0, text, common.stop.clone(), syntax, &req.tools.tools, reasoning.as_ref());
    let answer = Answer::new(st.clone(), id, run, out);
    // The served model's id, whatever the request named (one is served).
    let model = st.cfg.model_id.clone();
    if common.stream {
        Ok(reply::stream(answer, model, crate::keepalive::Quiet::new(st.cfg.sse_keepalive)))
    } else {
        reply::whole(answer, &model).await
    }
}

/// The prompt's tokens as the same body would be rendered to create a message.
pub async fn count_tokens(State(st): State<AppState>, body: Bytes) -> Result<Json<Value>, AnthropicError> {
    let obj = json_object(&body)?;
    let req = MessagesRequest::parse(&obj, Purpose::Count)?;
    let Rendered { prompt, .. } = rendered(&st, &req)?;
    Ok(Json(json!({ "input_tokens": prompt.len() })))
}
