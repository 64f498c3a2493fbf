//! OpenAI's Responses API: `POST /v1/responses`, `GET` and `DELETE
//! /v1/responses/{id}`, over the engine path chat takes. A response
//! stored (`store`, the default) can be continued with
//! `previous_response_id`: its conversation, then the new input, so the
//! prompt begins with the tokens the prefix cache already holds.

mod input;
mod keep;
mod reply;
mod request;
mod sealed;

use super::json_object;
use crate::answer::{new_id, Answer};
use crate::error::ApiError;
use crate::gen;
use crate::prompt::{self, Rendered};
use crate::state::{unix_now, AppState};
use crate::tool_plan::{choice_out, plan_tools};
use crate::unpaired;
use axum::body::Bytes;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use keep::Keep;
use reply::Meta;
use request::CreateRequest;
use serde_json::{json, Map, Value};

pub async fn create(State(st): State<AppState>, body: Bytes) -> Result<Response, ApiError> {
    let obj = json_object(&body)?;
    let req = CreateRequest::parse(&obj)?;
    // Instructions are this request's alone; the stored conversation does
    // not carry the previous request's (as OpenAI).
    let mut conversation = match &req.previous_response_id {
        Some(id) => st.responses.get(id).ok_or_else(|| previous_not_found(id))?.conversation.clone(),
        None => Vec::new(),
    };
    conversation.extend(req.input.iter().cloned());
    let mut messages: Vec<Value> = req.instructions.iter().map(|i| json!({ "role": "system", "content": i })).collect();
    messages.extend(conversation.iter().cloned());
    if messages.is_empty() {
        return Err(ApiError::param("input", "`input` must hold at least one item"));
    }
    // Items were checked as they were read; what is left to find here
    // (a call's arguments that are not JSON) is reported against `input`.
    host_tools::pair_tool_results(&messages).map_err(unpaired::responses)?;
    let messages = host_tools::template_messages(&messages)
        .map_err(|e| ApiError::param("input", format!("{}: {}", e.param, e.message)))?;
    let tools = prompt::function_tools(&req.tools.tools);
    let Rendered { text, prompt, reasoning } =
        prompt::render(&st, messages, tools, Map::new(), &req.thinking).map_err(|e| e.renamed("messages", "input"))?;
    let (grammar, syntax) = plan_tools(&st, &req.tools, req.format.clone())?;
    let gate = reasoning.as_ref().and_then(crate::reasoning::Plan::gate);
    let engine_req = gen::requests(&st, &req.common, prompt, None, grammar.as_ref(), gate)
        .map_err(|e| e.renamed("max_tokens", "max_output_tokens").renamed("messages", "input"))?
        .remove(0);
    let id = new_id("resp");
    let run = gen::submit(&st, &id, engine_req)?;
    let out = choice_out(0, text, Vec::new(), syntax, &req.tools.tools, reasoning.as_ref());
    let answer = Answer::new(st.clone(), id.clone(), run, out);
    let keep = Keep::new(st.clone(), conversation, req.store);
    let meta = Meta {
        id,
        created_at: unix_now(),
        model: st.cfg.model_id.clone(),
        previous_response_id: req.previous_response_id,
        store: req.store,
        seal_reasoning: req.seal_reasoning,
        echo: req.echo,
    };
    if req.common.stream {
        Ok(reply::stream(answer, meta, keep, crate::keepalive::Quiet::new(st.cfg.sse_keepalive)))
    } else {
        reply::whole(answer, meta, keep).await
    }
}

/// The `{id}` of the path; one that does not even decode names no response.
type ResponseId = Result<Path<String>, PathRejection>;

fn id_of(id: ResponseId) -> Result<String, ApiError> {
    id.map(|Path(id)| id).map_err(|_| not_found("(undecodable)"))
}

pub async fn retrieve(State(st): State<AppState>, id: ResponseId) -> Result<Json<Value>, ApiError> {
    let id = id_of(id)?;
    let stored = st.responses.get(&id).ok_or_else(|| not_found(&id))?;
    Ok(Json(stored.body.clone()))
}

pub async fn delete(State(st): State<AppState>, id: ResponseId) -> Result<Response, ApiError> {
    let id = id_of(id)?;
    if !st.responses.remove(&id) {
        return Err(not_found(&id));
    }
    Ok((StatusCode::OK, Json(json!({ "id": id, "object": "response.deleted", "deleted": true }))).into_response())
}

fn not_found(id: &str) -> ApiError {
    let mut e = ApiError::not_found(format!("No response found with id '{id}' (unknown, expired or not stored)."));
    e.code = Some("response_not_found");
    e
}

fn previous_not_found(id: &str) -> ApiError {
    let mut e = ApiError::param(
        "previous_response_id",
        format!(
            "Previous response with id '{id}' not found (unknown, expired, deleted or created with `store: false`)."
        ),
    );
    e.code = Some("previous_response_not_found");
    e
}
