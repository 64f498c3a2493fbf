//! Server-sent events with names (`event:` then `data:`), as the Anthropic
//! and Responses APIs send them, and the streaming response around them.
//! The pump that writes events stops when a send fails: the client is gone,
//! and dropping its job's receiver stops the job at its next step.

use crate::error::ApiError;
use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use std::convert::Infallible;
use tokio::sync::mpsc::{channel, Receiver, Sender};

pub type Events = Sender<Result<Bytes, Infallible>>;

/// One named event.
pub fn event(name: &str, data: &Value) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {}\n\n", serde_json::to_string(data).unwrap_or_default()))
}

/// A channel for a stream's events and the response that sends them.
pub fn open() -> (Events, Response) {
    let (tx, rx): (Events, Receiver<_>) = channel(64);
    (tx, response(Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx))))
}

/// An event-stream response with `body` (events already known, or a channel's).
pub fn response(body: Body) -> Response {
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(body)
        .unwrap_or_else(|_| ApiError::internal("building the stream").into_response())
}
