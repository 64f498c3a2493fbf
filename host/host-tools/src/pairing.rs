//! Tool results matched against the calls they answer.
//!
//! OpenAI and Anthropic refuse a history in which a tool result answers no
//! call of the assistant turn right before it, or in which a call goes
//! unanswered before the conversation moves on: the model would be shown a
//! result it never asked for, or a call with no outcome. The routes word
//! the refusal in their own API's terms; the rule is one.

use serde_json::Value;

/// Where a chat-shaped history (`template_messages`' input or output) breaks
/// the pairing of tool calls and tool results.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unpaired {
    /// `messages[result]` is a tool result whose id is no unanswered call
    /// of the assistant message right before its run of tool results.
    UnknownResult { result: usize, id: String },
    /// The calls of `messages[call]` that no tool result answers before the
    /// next message that is not a tool result (or the end).
    Unanswered { call: usize, ids: Vec<String> },
    /// `messages[call]` gives `id` to more than one of its calls: a result
    /// could not say which of them it answers.
    DuplicateCall { call: usize, id: String },
}

/// Checks that each assistant message's `tool_calls` have ids of their own
/// and are answered, each exactly once, by the `tool` messages that directly
/// follow it, and that every `tool` message answers one of them.
pub fn pair_tool_results(messages: &[Value]) -> Result<(), Unpaired> {
    // The calls of the last assistant message still waiting for a result.
    let mut open: Option<(usize, Vec<String>)> = None;
    for (i, m) in messages.iter().enumerate() {
        if m["role"] == "tool" {
            let id = m["tool_call_id"].as_str().unwrap_or_default();
            let answered = open.as_mut().and_then(|(_, ids)| ids.iter().position(|c| c == id).map(|k| ids.remove(k)));
            if answered.is_none() {
                return Err(Unpaired::UnknownResult { result: i, id: id.to_owned() });
            }
            continue;
        }
        close(open.take())?;
        let ids: Vec<String> = match m["tool_calls"].as_array() {
            Some(calls) => calls.iter().filter_map(|c| c["id"].as_str().map(str::to_owned)).collect(),
            None => Vec::new(),
        };
        if let Some(id) = ids.iter().enumerate().find_map(|(k, id)| ids[..k].contains(id).then_some(id)) {
            return Err(Unpaired::DuplicateCall { call: i, id: id.clone() });
        }
        if m["role"] == "assistant" && !ids.is_empty() {
            open = Some((i, ids));
        }
    }
    close(open)
}

fn close(open: Option<(usize, Vec<String>)>) -> Result<(), Unpaired> {
    match open {
        Some((call, ids)) if !ids.is_empty() => Err(Unpaired::Unanswered { call, ids }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn call(ids: &[&str]) -> Value {
        let calls: Vec<Value> = ids
            .iter()
            .map(|id| json!({"id": id, "type": "function", "function": {"name": "f", "arguments": {}}}))
            .collect();
        json!({"role": "assistant", "content": null, "tool_calls": calls})
    }
    fn result(id: &str) -> Value {
        json!({"role": "tool", "tool_call_id": id, "content": "ok"})
    }
    fn user() -> Value {
        json!({"role": "user", "content": "x"})
    }

    #[test]
    fn answered_calls_pair_in_any_order() {
        let history = [user(), call(&["a", "b"]), result("b"), result("a"), user(), call(&["c"]), result("c")];
        assert_eq!(pair_tool_results(&history), Ok(()));
        assert_eq!(pair_tool_results(&[user()]), Ok(()));
    }

    #[test]
    fn a_result_must_answer_an_open_call_of_the_turn_before_it() {
        let unknown = |history: &[Value], result: usize, id: &str| {
            assert_eq!(pair_tool_results(history), Err(Unpaired::UnknownResult { result, id: id.into() }));
        };
        unknown(&[user(), call(&["a"]), result("x")], 2, "x");
        // Answered twice.
        unknown(&[user(), call(&["a"]), result("a"), result("a")], 3, "a");
        // No call before it at all.
        unknown(&[user(), result("a")], 1, "a");
        // A call of an earlier turn: results follow their own turn.
        unknown(&[user(), call(&["a"]), result("a"), user(), result("a")], 4, "a");
    }

    #[test]
    fn every_call_is_answered_before_the_conversation_moves_on() {
        let unanswered = |history: &[Value], call: usize, ids: &[&str]| {
            let ids = ids.iter().map(|s| s.to_string()).collect();
            assert_eq!(pair_tool_results(history), Err(Unpaired::Unanswered { call, ids }));
        };
        unanswered(&[user(), call(&["a", "b"]), result("a"), user()], 1, &["b"]);
        unanswered(&[user(), call(&["a", "b"])], 1, &["a", "b"]);
        unanswered(&[user(), call(&["a"]), call(&["b"]), result("b")], 1, &["a"]);
    }

    #[test]
    fn the_calls_of_one_turn_have_ids_of_their_own() {
        assert_eq!(
            pair_tool_results(&[user(), call(&["a", "b", "a"]), result("a"), result("b"), result("a")]),
            Err(Unpaired::DuplicateCall { call: 1, id: "a".into() })
        );
        // Ids may repeat across turns: results follow their own turn.
        assert_eq!(pair_tool_results(&[user(), call(&["a"]), result("a"), user(), call(&["a"]), result("a")]), Ok(()));
    }
}
