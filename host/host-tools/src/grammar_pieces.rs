//! What both tool-call grammar builders write: Lark string literals, and a
//! tool's schema made a `%json` document of its own.

use serde_json::{json, Value};

/// A Lark string literal (JSON string syntax, which Lark accepts).
pub(crate) fn quoted(s: &str) -> String {
    Value::String(s.to_string()).to_string()
}

/// `schema` made a document of its own for `%json`: definitions that the
/// tools' parameters refer to (`#/$defs/...`, resolved against the root)
/// moved to its root, and llguidance's options.
pub(crate) fn standalone(schema: &Value, params: &[&Value]) -> Value {
    let mut doc = schema.as_object().cloned().unwrap_or_default();
    for key in ["$defs", "definitions"] {
        let mut defs = doc.get(key).and_then(Value::as_object).cloned().unwrap_or_default();
        for p in params {
            if let Some(Value::Object(d)) = p.get(key) {
                for (name, def) in d {
                    defs.entry(name.clone()).or_insert_with(|| def.clone());
                }
            }
        }
        if !defs.is_empty() {
            doc.insert(key.into(), Value::Object(defs));
        }
    }
    doc.insert(
        "x-guidance".into(),
        json!({
            // Unknown keywords and formats in a client's schema must not
            // make the request fail.
            "lenient": true,
            // Arguments as chat templates write them (Python's json.dumps
            // separators, no other whitespace): free whitespace lets a
            // sampled model pad forever.
            "whitespace_flexible": false,
            "item_separator": ", ",
            "key_separator": ": ",
        }),
    );
    Value::Object(doc)
}
