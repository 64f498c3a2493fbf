//! What a finished response leaves in the response store: the
//! conversation it answered, then its output as the assistant's turn.

use crate::assistant_turn::AssistantTurn;
use crate::response_store::StoredResponse;
use crate::state::AppState;
use serde_json::Value;

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
    let mut turn = AssistantTurn::default();
    for item in output {
        match item["type"].as_str() {
            Some("reasoning") => texts(item).for_each(|t| turn.push_reasoning(t)),
            Some("message") => texts(item).for_each(|t| turn.push_text(t, "")),
            Some("function_call") => {
                turn.push_call(item["call_id"].clone(), item["name"].clone(), item["arguments"].clone())
            }
            _ => {}
        }
    }
    turn.into_message()
}

/// The texts of an output item's content parts.
fn texts(item: &Value) -> impl Iterator<Item = &str> {
    item["content"].as_array().into_iter().flatten().map(|p| p["text"].as_str().unwrap_or_default())
}
