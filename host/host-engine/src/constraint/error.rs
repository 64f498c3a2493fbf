//! Why a grammar cannot be used or failed, in words for the client.

/// Why a grammar cannot be used: the message says what is wrong with it.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct GrammarError(pub String);

/// llguidance's error without the parser state it appends (`<state>…`),
/// which is for llguidance's own debugging, not for a client.
pub(super) fn reason(e: impl std::fmt::Display) -> String {
    let e = e.to_string();
    e.split("\n<state>").next().unwrap_or_default().trim_end().to_owned()
}
