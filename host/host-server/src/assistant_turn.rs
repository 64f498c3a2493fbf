//! One assistant turn as the chat template reads it: its text, its
//! reasoning and its tool calls, gathered from whatever pieces an API sends
//! them in (Anthropic content blocks and consecutive assistant messages,
//! Responses input items, a stored response's output items) and written out
//! as one OpenAI-shaped assistant message.

use serde_json::{json, Value};

/// An assistant turn being gathered. `text` and `reasoning` are `None`
/// until a piece of that kind arrives, so a turn of reasoning alone is told
/// apart from one whose answer was empty.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct AssistantTurn {
    text: Option<String>,
    reasoning: Option<String>,
    calls: Vec<Value>,
}

impl AssistantTurn {
    /// Appends text; `separator` goes between two non-empty pieces
    /// (Anthropic joins consecutive turns by a blank line, the Responses
    /// items of one turn run on).
    pub fn push_text(&mut self, piece: &str, separator: &str) {
        let text = self.text.get_or_insert_with(String::new);
        if !text.is_empty() && !piece.is_empty() {
            text.push_str(separator);
        }
        text.push_str(piece);
    }

    pub fn push_reasoning(&mut self, piece: &str) {
        self.reasoning.get_or_insert_with(String::new).push_str(piece);
    }

    /// A call, kept in chat's shape: `{id, type: "function", function:
    /// {name, arguments}}` (`arguments` a JSON string or an object, as the
    /// API sent it).
    pub fn push_call(&mut self, id: Value, name: Value, arguments: Value) {
        self.calls.push(json!({ "id": id, "type": "function", "function": { "name": name, "arguments": arguments } }));
    }

    /// `next` joined after this turn: texts by `separator`, reasoning and
    /// calls in order.
    pub fn absorb(&mut self, next: AssistantTurn, separator: &str) {
        if let Some(t) = next.text {
            self.push_text(&t, separator);
        }
        if let Some(r) = next.reasoning {
            self.push_reasoning(&r);
        }
        self.calls.extend(next.calls);
    }

    pub fn is_empty(&self) -> bool {
        self.text.is_none() && self.reasoning.is_none() && self.calls.is_empty()
    }

    pub fn has_calls(&self) -> bool {
        !self.calls.is_empty()
    }

    /// Reasoning so far and nothing else: the turn's answer or calls are
    /// still to come.
    pub fn reasoning_alone(&self) -> bool {
        self.reasoning.is_some() && self.text.as_deref().is_none_or(str::is_empty) && self.calls.is_empty()
    }

    /// The chat message: `content` is the text, `null` for calls without
    /// text, and `""` for a turn of reasoning alone (templates read a
    /// string there).
    pub fn into_message(self) -> Value {
        let text = self.text.filter(|t| !t.is_empty());
        let content = match text {
            Some(t) => Value::String(t),
            None if self.calls.is_empty() => Value::String(String::new()),
            None => Value::Null,
        };
        let mut m = json!({ "role": "assistant", "content": content });
        if !self.calls.is_empty() {
            m["tool_calls"] = Value::Array(self.calls);
        }
        if let Some(r) = self.reasoning {
            m["reasoning_content"] = Value::String(r);
        }
        m
    }
}

/// A conversation being gathered: chat messages as they are, assistant
/// turns still open to joining pieces.
#[derive(Debug, Clone, PartialEq)]
pub enum Turn {
    Message(Value),
    Assistant(AssistantTurn),
}

/// The assistant turn at the end of `turns` when `joins` takes it, else a
/// new one opened there.
pub fn joining(turns: &mut Vec<Turn>, joins: impl FnOnce(&AssistantTurn) -> bool) -> &mut AssistantTurn {
    if !matches!(turns.last(), Some(Turn::Assistant(last)) if joins(last)) {
        turns.push(Turn::Assistant(AssistantTurn::default()));
    }
    match turns.last_mut() {
        Some(Turn::Assistant(turn)) => turn,
        _ => unreachable!("the last turn is an assistant turn: taken or just opened"),
    }
}

/// The chat messages of gathered turns.
pub fn into_messages(turns: Vec<Turn>) -> Vec<Value> {
    turns
        .into_iter()
        .map(|t| match t {
            Turn::Message(m) => m,
            Turn::Assistant(a) => a.into_message(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(id: &str) -> Value {
        json!({ "id": id, "type": "function", "function": { "name": "f", "arguments": "{}" } })
    }

    fn push_call(t: &mut AssistantTurn, id: &str) {
        t.push_call(json!(id), json!("f"), json!("{}"));
    }

    #[test]
    fn content_is_the_text_null_beside_calls_alone_and_empty_for_reasoning_alone() {
        let mut t = AssistantTurn::default();
        t.push_text("Hi.", "\n\n");
        assert_eq!(t.clone().into_message(), json!({ "role": "assistant", "content": "Hi." }));
        let mut c = AssistantTurn::default();
        push_call(&mut c, "a");
        assert_eq!(c.into_message(), json!({ "role": "assistant", "content": null, "tool_calls": [call("a")] }));
        let mut r = AssistantTurn::default();
        r.push_reasoning("Think.");
        assert!(r.reasoning_alone());
        assert_eq!(r.into_message(), json!({ "role": "assistant", "content": "", "reasoning_content": "Think." }));
    }

    #[test]
    fn absorbed_turns_join_text_by_the_separator_and_keep_order() {
        let mut a = AssistantTurn::default();
        a.push_text("One.", "\n\n");
        a.push_reasoning("r1");
        push_call(&mut a, "a");
        let mut b = AssistantTurn::default();
        b.push_text("Two.", "\n\n");
        b.push_reasoning("r2");
        push_call(&mut b, "b");
        a.absorb(b, "\n\n");
        assert_eq!(
            a.into_message(),
            json!({ "role": "assistant", "content": "One.\n\nTwo.", "reasoning_content": "r1r2",
                    "tool_calls": [call("a"), call("b")] })
        );
        let mut empty_first = AssistantTurn::default();
        empty_first.push_text("", "\n\n");
        empty_first.push_text("After.", "\n\n");
        assert_eq!(empty_first.into_message()["content"], "After.");
    }
}
