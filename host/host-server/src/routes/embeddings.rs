//! `POST /v1/embeddings`: inputs to vectors, for folders that declare
//! sentence-transformers pooling. The vectors come from the engine thread
//! (an embedding job on the worker's queue), so they never race generation.

use super::json_object;
use crate::embed_wire::{self, EmbedBody, Input};
use crate::error::ApiError;
use crate::state::AppState;
use crate::wire::Fields;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use host_engine::{InputOut, InputTask};
use serde_json::{json, Value};

pub async fn handler(State(st): State<AppState>, body: Bytes) -> Result<Response, ApiError> {
    let obj = json_object(&body)?;
    let req = EmbedBody::parse(&Fields(&obj))?;
    let pooling = st.info.embeddings.as_ref().map_err(|e| ApiError::invalid(e.to_string()))?.clone();
    if let Some(n) = req.dimensions.filter(|&n| n > st.info.hidden_size) {
        return Err(ApiError::param(
            "dimensions",
            format!("`dimensions` can be at most {} for this model, got {n}", st.info.hidden_size),
        ));
    }
    let inputs = tokenize(&st, &req.inputs)?;
    let longest = inputs.iter().map(Vec::len).max().unwrap_or(0) as u64;
    if let Some(why) = st.memory.refuse(&st.budget, longest, longest) {
        let mut e = ApiError::param("input", why);
        e.code = Some("insufficient_memory");
        return Err(e);
    }
    let prompt_tokens: usize = inputs.iter().map(Vec::len).sum();
    let mut vectors = embed(&st, inputs).await?;
    if let Some(n) = req.dimensions {
        for v in &mut vectors {
            embed_wire::truncate(v, n, pooling.normalize);
        }
    }
    let data: Vec<Value> = vectors
        .iter()
        .enumerate()
        .map(|(i, v)| json!({ "object": "embedding", "index": i, "embedding": embed_wire::encode(v, req.encoding) }))
        .collect();
    Ok(axum::Json(json!({
        "object": "list",
        "data": data,
        "model": st.cfg.model_id,
        "usage": { "prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens },
    }))
    .into_response())
}

/// Token ids per input (text through the tokenizer as a plain prompt),
/// each within the context and the vocabulary.
fn tokenize(st: &AppState, inputs: &[Input]) -> Result<Vec<Vec<u32>>, ApiError> {
    let ctx = st.info.max_context;
    let mut out = Vec::with_capacity(inputs.len());
    for (n, input) in inputs.iter().enumerate() {
        let ids = match input {
            Input::Ids(ids) => ids.clone(),
            Input::Text(s) => st
                .text
                .as_ref()
                .ok_or_else(|| ApiError::param("input", "this model has no tokenizer: send token ids"))?
                .encode_prompt(s)
                .map_err(|e| ApiError::param("input", e.to_string()))?,
        };
        if ctx > 0 && ids.len() > ctx {
            let mut e = ApiError::param(
                "input",
                format!("this model's maximum context length is {ctx} tokens, but input {n} has {} tokens", ids.len()),
            );
            e.code = Some("context_length_exceeded");
            return Err(e);
        }
        if let Some(bad) = ids.iter().find(|&&t| t >= st.info.vocab_size) {
            return Err(ApiError::param(
                "input",
                format!("token id {bad} is outside the vocabulary (size {})", st.info.vocab_size),
            ));
        }
        out.push(ids);
    }
    Ok(out)
}

/// Runs the inputs on the engine thread and waits for their vectors.
async fn embed(st: &AppState, inputs: Vec<Vec<u32>>) -> Result<Vec<Vec<f32>>, ApiError> {
    match crate::gen::run_inputs(st, inputs, InputTask::Embed, "embedding").await? {
        InputOut::Vectors(v) => Ok(v),
        InputOut::Scores(_) => Err(ApiError::internal("the engine answered an embedding job with scores")),
    }
}
