//! OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}`
//! with the right HTTP status, for every failure a client can cause.

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
    pub retry_after: Option<u32>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self { status, message: message.into(), kind, param: None, code: None, retry_after: None }
    }

    /// 400 for a request the server understands but cannot accept.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// 400 naming the offending parameter.
    pub fn param(param: &str, message: impl Into<String>) -> Self {
        let mut e = Self::invalid(message);
        e.param = Some(param.to_owned());
        e
    }

    /// 400 for a recognised parameter whose value is not supported (yet).
    pub fn unsupported(param: &str, message: impl Into<String>) -> Self {
        let mut e = Self::param(param, message);
        e.code = Some("unsupported_parameter");
        e
    }

    pub fn context_length(message: impl Into<String>) -> Self {
        let mut e = Self::param("messages", message);
        e.code = Some("context_length_exceeded");
        e
    }

    pub fn unauthorized() -> Self {
        let mut e = Self::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "invalid or missing API key (send `Authorization: Bearer <key>`)",
        );
        e.code = Some("invalid_api_key");
        e
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "invalid_request_error", message)
    }

    pub fn method_not_allowed() -> Self {
        Self::new(StatusCode::METHOD_NOT_ALLOWED, "invalid_request_error", "method not allowed on this path")
    }

    pub fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("request body exceeds the limit of {limit} bytes"),
        )
    }

    pub fn unsupported_media_type() -> Self {
        Self::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, "invalid_request_error", "send the body as application/json")
    }

    pub fn busy() -> Self {
        let mut e =
            Self::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", "the request queue is full; retry shortly");
        e.retry_after = Some(1);
        e
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    pub fn body(&self) -> serde_json::Value {
        json!({ "error": { "message": self.message, "type": self.kind, "param": self.param, "code": self.code } })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut().insert("retry-after", HeaderValue::from(s));
        }
        r
    }
}
