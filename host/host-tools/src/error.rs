//! The one error this crate returns: what the client sent wrong, and where.

use thiserror::Error;

/// A request that cannot be served as sent (an HTTP 400). `param` names the
/// offending parameter the way OpenAI's error body does, e.g.
/// `tools[2].function.name` or `messages[3].tool_calls[0].function.arguments`,
/// so the server reports it without reading the message.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("invalid '{param}': {message}")]
pub struct ToolError {
    pub param: String,
    pub message: String,
}

impl ToolError {
    pub(crate) fn new(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self { param: param.into(), message: message.into() }
    }
}
