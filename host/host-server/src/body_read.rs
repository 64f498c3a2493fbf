//! Reads a request's body whole before a handler sees it, under the body
//! limit and two deadlines: one between its chunks, so that a client that
//! stops sending part-way gets a 408 instead of holding its connection and
//! task forever, and one on the whole body that grows with what arrived, so
//! that a client trickling a byte just inside the first cannot hold it
//! either.

use crate::error::ApiError;
use axum::body::{Body, Bytes};
use axum::http::StatusCode;
use std::time::{Duration, Instant};
use tokio_stream::StreamExt;

/// Bytes a second a body must average, past its first `idle`, as Apache's
/// mod_reqtimeout asks by default (`body=20,MinRate=500`): a 4 MiB body
/// may take 2.3 hours, a byte every 29 s of a 30 s deadline only 30 s.
const MIN_RATE: f64 = 500.0;

pub async fn read_whole(body: Body, limit: usize, idle: Option<Duration>) -> Result<Bytes, ApiError> {
    let mut chunks = body.into_data_stream();
    let mut whole = Vec::new();
    let started = Instant::now();
    let mut last = started;
    loop {
        let next = match idle {
            Some(d) => {
                let idle_by = last + d;
                let whole_by = started + d + Duration::from_secs_f64(whole.len() as f64 / MIN_RATE);
                let slow = whole_by < idle_by;
                let by = if slow { whole_by } else { idle_by };
                tokio::time::timeout_at(by.into(), chunks.next()).await.map_err(|_| match slow {
                    true => too_slow(whole.len(), started.elapsed()),
                    false => stalled(d),
                })?
            }
            None => chunks.next().await,
        };
        match next {
            None => return Ok(whole.into()),
            Some(Ok(chunk)) if whole.len() + chunk.len() > limit => return Err(ApiError::too_large(limit)),
            Some(Ok(chunk)) => {
                whole.extend_from_slice(&chunk);
                last = Instant::now();
            }
            Some(Err(e)) => return Err(ApiError::client(StatusCode::BAD_REQUEST, broken(&e))),
        }
    }
}

fn too_slow(received: usize, took: Duration) -> ApiError {
    ApiError::client(
        StatusCode::REQUEST_TIMEOUT,
        format!(
            "the request body arrives too slowly: {received} bytes in {:.1} s (past the read timeout a body must average {MIN_RATE} bytes a second)",
            took.as_secs_f32()
        ),
    )
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
