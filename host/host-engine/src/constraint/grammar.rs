//! What a request can constrain its output to.

/// What a request constrains its output to.
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, PartialEq)]
pub enum Grammar {
    /// A JSON value valid under this JSON Schema.
    JsonSchema(serde_json::Value),
    /// Any JSON object.
    JsonObject,
    /// A string matching this regular expression (whole output).
    Regex(String),
    /// A Lark grammar (llguidance's dialect: `%json { schema }` embeds a
    /// JSON Schema, `start` is the start rule).
    Lark(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
}
