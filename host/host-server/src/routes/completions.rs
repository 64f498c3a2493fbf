//! `POST /v1/completions`: raw text (or token ids) in, text out.

use super::{json_object, top_count};
use crate::assemble::Assembler;
use crate::choice::ChoiceOut;
use crate::error::ApiError;
use crate::gen;
use crate::respond::{self, Api, Ctx};
use crate::state::{unix_now, AppState};
use crate::structured;
use crate::wire::{Common, Fields};
use axum::body::Bytes;
use axum::extract::State;
use axum::response::Response;
use serde_json::Value;

/// `prompt`: a string, a one-element array of strings, or token ids.
fn prompt_ids(st: &AppState, v: Option<&Value>) -> Result<Vec<u32>, ApiError> {
    let text =
        || st.text.clone().ok_or_else(|| ApiError::param("prompt", "this model has no tokenizer: send token ids"));
    let ids = |a: &Vec<Value>| -> Result<Vec<u32>, ApiError> {
        a.iter()
            .map(|x| {
                x.as_u64()
                    .filter(|n| *n < u32::MAX as u64)
                    .map(|n| n as u32)
                    .ok_or_else(|| ApiError::param("prompt", "token ids must be non-negative integers"))
            })
            .collect()
    };
    match v {
        None => Err(ApiError::param("prompt", "`prompt` is required")),
        Some(Value::String(s)) => text()?.encode_prompt(s).map_err(|e| ApiError::param("prompt", e.to_string())),
        Some(Value::Array(a)) if a.is_empty() => Err(ApiError::param("prompt", "`prompt` must not be empty")),
        Some(Value::Array(a)) if a.iter().all(Value::is_number) => ids(a),
        Some(Value::Array(a)) if a.len() == 1 => match &a[0] {
            Value::String(s) => text()?.encode_prompt(s).map_err(|e| ApiError::param("prompt", e.to_string())),
            Value::Array(inner) => ids(inner),
            _ => Err(ApiError::param("prompt", "`prompt` must be a string, an array of strings, or token ids")),
        },
        Some(Value::Array(_)) => {
            Err(ApiError::unsupported("prompt", "several prompts in one request are not supported (send one)"))
        }
        Some(_) => Err(ApiError::param("prompt", "`prompt` must be a string, an array of strings, or token ids")),
    }
}

pub async fn handler(State(st): State<AppState>, body: Bytes) -> Result<Response, ApiError> {
    let obj = json_object(&body)?;
    let f = Fields(&obj);
    if f.boolean("echo")? {
        return Err(ApiError::unsupported("echo", "`echo` is not supported yet"));
    }
    if f.value("suffix").is_some_and(|s| s.as_str() != Some("")) {
        return Err(ApiError::unsupported("suffix", "`suffix` (insertion) is not supported"));
    }
    let prompt = prompt_ids(&st, f.value("prompt"))?;
    let common = Common::parse(&f, "max_tokens")?;
    let logprobs = top_count(f.value("logprobs"), 5, "logprobs")?;
    let grammar = structured::requested(&f)?;
    let reqs = gen::requests(&st, &common, prompt, logprobs, grammar.as_ref())?;
    let text = st.text.clone().ok_or_else(|| ApiError::invalid("this model has no tokenizer to decode its output"))?;
    let id = st.next_id("cmpl");
    let mut runs = Vec::with_capacity(reqs.len());
    for (i, req) in reqs.into_iter().enumerate() {
        let out = ChoiceOut::new(i, Assembler::new(text.clone(), common.stop.clone()), None);
        runs.push((gen::submit(&st, &id, req)?, out));
    }
    let ctx = Ctx {
        st: st.clone(),
        api: Api::Completion,
        id,
        created: unix_now(),
        logprobs,
        include_usage: common.include_usage,
    };
    if common.stream {
        Ok(respond::stream(ctx, runs))
    } else {
        respond::complete(ctx, runs).await
    }
}
