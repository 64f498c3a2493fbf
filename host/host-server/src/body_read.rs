//! Reads a request's body whole before a handler sees it, under the body
//! limit and a deadline between its chunks: a client that stops sending
//! part-way gets a 408 instead of holding its connection and task forever.

use crate::error::ApiError;
use axum::body::{Body, Bytes};
use axum::http::StatusCode;
use std::time::Duration;
use tokio_stream::StreamExt;

pub async fn read_whole(body: Body, limit: usize, idle: Option<Duration>) -> Result<Bytes, ApiError> {
    let mut chunks = body.into_data_stream();
    let mut whole = Vec::new();
    loop {
        let next = match idle {
            Some(d) => tokio::time::timeout(d, chunks.next()).await.map_err(|_| stalled(d))?,
            None => chunks.next().await,
        };
        match next {
            None => return Ok(whole.into()),
            Some(Ok(chunk)) if whole.len() + chunk.len() > limit => return Err(ApiError::too_large(limit)),
            Some(Ok(chunk)) => whole.extend_from_slice(&chunk),
            Some(Err(e)) => return Err(ApiError::client(StatusCode::BAD_REQUEST, broken(&e))),
        }
    }
}

fn stalled(d: Duration) -> ApiError {
    ApiError::client(
        StatusCode::REQUEST_TIMEOUT,
        format!("the request body stopped arriving: nothing came for {} s", d.as_secs_f32()),
    )
}

/// The error and its causes: hyper's own text ("error reading a body from
/// connection") says nothing of why.
fn broken(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = format!("could not read the request body: {e}");
    let mut said = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        // axum's error gives its inner one as its source: the same text.
        let now = c.to_string();
        if now != said {
            text.push_str(&format!(": {now}"));
        }
        said = now;
        cause = c.source();
    }
    text
}
