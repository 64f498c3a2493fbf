//! Errors for every failure a client can cause, with the right HTTP status:
//! OpenAI's shape `{"error": {"message", "type", "param", "code"}}` by
//! default, Anthropic's `{"type": "error", "error": {"type", "message"}}`
//! for the Messages API (`AnthropicError`, `shaped_for`).

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
            "invalid or missing API key (send `Authorization: Bearer <key>` or `x-api-key: <key>`)",
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

    /// The isolated engine's process died and a new one is loading.
    pub fn restarting() -> Self {
        let mut e = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "the engine is restarting after its process ended; retry shortly",
        );
        e.retry_after = Some(1);
        e
    }

    /// A client error of `status` that no route chose (an extractor's
    /// rejection), with its reason.
    pub fn client(status: StatusCode, message: impl Into<String>) -> Self {
        Self::new(status, "invalid_request_error", message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// A generation that ended in an error: 400 when the request's own
    /// grammar failed part-way (a parser limit it ran into), 500 otherwise.
    pub fn generation_failed(e: &host_engine::EngineError) -> Self {
        match e {
            host_engine::EngineError::Grammar(g) => {
                Self::invalid(format!("the request's grammar failed during generation: {g}"))
            }
            other => Self::internal(format!("generation failed: {other}")),
        }
    }

    /// The same error naming `to` where it named `from` (as its parameter,
    /// or quoted in its message): a shared check reports the field by an
    /// endpoint's own name (`max_output_tokens`).
    pub fn renamed(mut self, from: &str, to: &str) -> Self {
        if self.param.as_deref() == Some(from) {
            self.param = Some(to.to_owned());
        }
        self.message = self.message.replace(&format!("`{from}`"), &format!("`{to}`"));
        self
    }

    pub fn body(&self) -> serde_json::Value {
        json!({ "error": { "message": self.message, "type": self.kind, "param": self.param, "code": self.code } })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        with_retry_after((self.status, Json(self.body())).into_response(), self.retry_after)
    }
}

fn with_retry_after(mut r: Response, seconds: Option<u32>) -> Response {
    if let Some(s) = seconds {
        r.headers_mut().insert("retry-after", HeaderValue::from(s));
    }
    r
}

/// Anthropic's status for an overloaded API, which its SDKs retry.
const OVERLOADED: u16 = 529;

/// An error as Anthropic's Messages API reports it. Anthropic's error types
/// go by status; a full queue is its 529 `overloaded_error`.
#[derive(Debug, Clone)]
pub struct AnthropicError(pub ApiError);

impl From<ApiError> for AnthropicError {
    fn from(e: ApiError) -> Self {
        Self(e)
    }
}

impl AnthropicError {
    pub fn status(&self) -> StatusCode {
        match self.0.status {
            StatusCode::SERVICE_UNAVAILABLE => {
                StatusCode::from_u16(OVERLOADED).unwrap_or(StatusCode::SERVICE_UNAVAILABLE)
            }
            s => s,
        }
    }

    /// Anthropic's `error.type` for this status.
    pub fn kind(&self) -> &'static str {
        match self.status().as_u16() {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            OVERLOADED => "overloaded_error",
            400..=499 => "invalid_request_error",
            _ => "api_error",
        }
    }

    pub fn body(&self) -> serde_json::Value {
        json!({ "type": "error", "error": { "type": self.kind(), "message": self.0.message } })
    }
}

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        with_retry_after((self.status(), Json(self.body())).into_response(), self.0.retry_after)
    }
}

/// Whether `path` belongs to Anthropic's Messages API.
pub fn is_anthropic_path(path: &str) -> bool {
    path == "/v1/messages" || path.starts_with("/v1/messages/")
}

/// `e` in the shape of the API that `path` belongs to (for the failures
/// that happen before a handler runs: auth, body size, unknown paths).
pub fn shaped_for(path: &str, e: ApiError) -> Response {
    if is_anthropic_path(path) {
        AnthropicError(e).into_response()
    } else {
        e.into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anthropic_types_follow_the_status() {
        let cases = [
            (ApiError::invalid("x"), 400, "invalid_request_error"),
            (ApiError::unauthorized(), 401, "authentication_error"),
            (ApiError::not_found("x"), 404, "not_found_error"),
            (ApiError::method_not_allowed(), 405, "invalid_request_error"),
            (ApiError::too_large(1), 413, "request_too_large"),
            (ApiError::busy(), 529, "overloaded_error"),
            (ApiError::internal("x"), 500, "api_error"),
        ];
        for (e, status, kind) in cases {
            let a = AnthropicError(e);
            assert_eq!((a.status().as_u16(), a.kind()), (status, kind));
            assert_eq!(a.body()["type"], "error");
            assert_eq!(a.body()["error"]["type"], kind);
        }
        let r = AnthropicError(ApiError::busy()).into_response();
        assert_eq!(r.headers().get("retry-after").and_then(|v| v.to_str().ok()), Some("1"));
    }

    #[test]
    fn renamed_changes_the_named_parameter_and_its_name_in_messages() {
        let e =
            ApiError::param("max_tokens", "`max_tokens` must be at least 1").renamed("max_tokens", "max_output_tokens");
        assert_eq!(
            (e.param.as_deref(), e.message.as_str()),
            (Some("max_output_tokens"), "`max_output_tokens` must be at least 1")
        );
        let e = ApiError::param("top_p", "`top_p` is wrong").renamed("max_tokens", "max_output_tokens");
        assert_eq!((e.param.as_deref(), e.message.as_str()), (Some("top_p"), "`top_p` is wrong"));
        // A context error names `messages` but quotes `max_tokens`.
        let e = ApiError::context_length("the prompt has 9 tokens and `max_tokens` asks for 5000 more")
            .renamed("max_tokens", "max_output_tokens")
            .renamed("messages", "input");
        assert_eq!(
            (e.param.as_deref(), e.message.as_str()),
            (Some("input"), "the prompt has 9 tokens and `max_output_tokens` asks for 5000 more")
        );
    }
}
