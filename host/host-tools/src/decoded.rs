//! One tool call as the model wrote it, whichever syntax it came in.

use serde_json::{Map, Value};

/// One call as the model wrote it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Decoded {
    pub name: String,
    pub arguments: Map<String, Value>,
}

/// Characters a function name may have in the syntaxes that write it bare.
pub(crate) fn is_name_char(c: char) -> bool {
    c.is_alphanumeric() || matches!(c, '_' | '-' | '.')
}
