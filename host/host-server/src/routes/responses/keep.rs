//! What a finished response leaves in the response store: the
//! conversation it answered, then its output as the assistant's turn.

use crate::response_store::StoredResponse;
use crate::state::AppState;
use serde_json::{json, Value};

/// What a finished response leaves in the store: the conversation it
/// answered, then its output as the assistant's turn.
pub struct Keep {
    st: AppState,
    conversation: Vec<Value>,
    store: bool,
}

impl Keep {
    pub fn new(st: AppState, conversation: Vec<Value>, store: bool) -> Self {
        Self { st, conversation, store }
    }

    pub fn keep(self, id: &str, body: &Value, output: &[Value]) {
        if !self.store {
            return;
        }
        let mut conversation = self.conversation;
        conversation.push(assistant_turn(output));
        if !self.st.responses.put(id, StoredResponse { body: body.clone(), conversation }) {
            tracing::warn!(id, "the response is larger than the response store's cap: not stored");
        }
    }
}

/// Output items as the chat message a template renders for them.
fn assistant_turn(output: &[Value]) -> Value {
    let mut text = String::new();
    let mut calls = Vec::new();
    let mut reasoning: Option<String> = None;
    for item in output {
        match item["type"].as_str() {
            Some("reasoning") => {
                for part in item["content"].as_array().into_iter().flatten() {
                    reasoning.get_or_insert_with(String::new).push_str(part["text"].as_str().unwrap_or_default());
                }
            }
            Some("message") => {
                for part in item["content"].as_array().into_iter().flatten() {
                    text.push_str(part["text"].as_str().unwrap_or_default());
                }
            }
            Some("function_call") => calls.push(json!({
                "id": item["call_id"],
                "type": "function",
                "function": { "name": item["name"], "arguments": item["arguments"] },
            })),
            _ => {}
        }
    }
    let content = if text.is_empty() && !calls.is_empty() { Value::Null } else { Value::String(text) };
    let mut m = json!({ "role": "assistant", "content": content });
    if !calls.is_empty() {
        m["tool_calls"] = Value::Array(calls);
    }
    if let Some(r) = reasoning {
        m["reasoning_content"] = Value::String(r);
    }
    m
}
