//! One module per endpoint.

pub mod anthropic;
pub mod chat;
pub mod completions;
pub mod debug;
pub mod embeddings;
pub mod info;
pub mod metrics;
pub mod responses;

use crate::error::ApiError;
use axum::body::Bytes;
use serde_json::{Map, Value};

/// Parses a request body as a JSON object, with OpenAI-shaped errors for
/// invalid UTF-8, malformed JSON and non-object bodies.
pub fn json_object(body: &Bytes) -> Result<Map<String, Value>, ApiError> {
    if body.is_empty() {
        return Err(ApiError::invalid("the request body is empty: send a JSON object"));
    }
    let text = std::str::from_utf8(body)
        .map_err(|e| ApiError::invalid(format!("the request body is not valid UTF-8 (at byte {})", e.valid_up_to())))?;
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(ApiError::invalid("the request body must be a JSON object")),
        Err(e) => Err(ApiError::invalid(format!("malformed JSON in the request body: {e}"))),
    }
}

/// `logprobs` (chat: bool + `top_logprobs`; completions: an integer).
pub fn top_count(v: Option<&Value>, max: i64, param: &str) -> Result<Option<usize>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(x) => match x.as_i64() {
            Some(n) if (0..=max).contains(&n) => Ok(Some(n as usize)),
            _ => Err(ApiError::param(param, format!("`{param}` must be an integer between 0 and {max}"))),
        },
    }
}
