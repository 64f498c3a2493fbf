//! `POST /v1/chat/completions`.

use super::{json_object, top_count};
use crate::assemble::Assembler;
use crate::error::ApiError;
use crate::gen;
use crate::respond::{self, Api, Ctx};
use crate::state::{unix_now, AppState};
use crate::wire::{message_text, Common, Fields};
use axum::body::Bytes;
use axum::extract::State;
use axum::response::Response;
use serde_json::{json, Value};

const ROLES: &[&str] = &["system", "developer", "user", "assistant"];

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
    let mut normalized = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        let role = m
            .get("role")
            .and_then(Value::as_str)
            .ok_or_else(|| ApiError::param(&format!("messages[{i}].role"), "each message needs a string `role`"))?;
        if role == "tool" || role == "function" {
            return Err(ApiError::unsupported(&format!("messages[{i}].role"), "tool messages are not supported yet"));
        }
        if !ROLES.contains(&role) {
            return Err(ApiError::param(
                &format!("messages[{i}].role"),
                format!("unknown role `{role}` (system, developer, user, assistant)"),
            ));
        }
        let content = message_text(m.get("content").unwrap_or(&Value::Null), i)?;
        // The OpenAI `developer` role is the system prompt for these models.
        let role = if role == "developer" { "system" } else { role };
        normalized.push(json!({ "role": role, "content": content }));
    }
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
    let text = st
        .text
        .clone()
        .ok_or_else(|| ApiError::invalid("this model has no tokenizer: use /v1/completions with token ids"))?;
    let template = text
        .template
        .as_ref()
        .ok_or_else(|| ApiError::invalid("this model has no chat template: use /v1/completions"))?;
    let rendered =
        template.render(&Value::Array(normalized), true, &kwargs).map_err(|e| ApiError::param("messages", e.to_string()))?;
    let prompt = text.encode_rendered(&rendered).map_err(|e| ApiError::invalid(e.to_string()))?;
    let req = gen::request(&st, &common, prompt, logprobs)?;
    let id = st.next_id("chatcmpl");
    let run = gen::submit(&st, &id, req)?;
    let ctx =
        Ctx { st: st.clone(), api: Api::Chat, id, created: unix_now(), logprobs, include_usage: common.include_usage };
    let asm = Assembler::new(text, common.stop.clone());
    if common.stream {
        Ok(respond::stream(ctx, run, asm))
    } else {
        respond::complete(ctx, run, asm).await
    }
}
