//! The refusal of a history whose tool results and calls do not pair
//! (`host_tools::pair_tool_results`), in each API's own words: OpenAI chat
//! names the message, Responses names `input` as OpenAI does, Messages
//! names the ids as Anthropic does.

use crate::error::ApiError;
use host_tools::Unpaired;

pub fn chat(u: Unpaired) -> ApiError {
    match u {
        Unpaired::UnknownResult { result, id } => {
            let at = format!("messages[{result}].tool_call_id");
            ApiError::param(
                &at,
                format!("`{at}` '{id}' answers no tool call of the assistant message before it: a tool message must follow the assistant message whose `tool_calls` it answers"),
            )
        }
        Unpaired::Unanswered { call, ids } => {
            let at = format!("messages[{call}].tool_calls");
            ApiError::param(
                &at,
                format!("an assistant message with `tool_calls` must be followed by tool messages answering each `tool_call_id`; `{at}` has none for: {}", ids.join(", ")),
            )
        }
        Unpaired::DuplicateCall { call, id } => {
            let at = format!("messages[{call}].tool_calls");
            ApiError::param(
                &at,
                format!("Duplicate value for 'id' of '{id}' in `{at}`: each tool call of a message needs its own id, which its tool message answers"),
            )
        }
    }
}

pub fn responses(u: Unpaired) -> ApiError {
    match u {
        Unpaired::UnknownResult { id, .. } => ApiError::param(
            "input",
            format!("no tool call found for function call output with call_id '{id}': a `function_call_output` follows the `function_call` items it answers"),
        ),
        Unpaired::Unanswered { ids, .. } => ApiError::param(
            "input",
            format!("no tool output found for function call {}: each `function_call` needs its `function_call_output` before the next message", ids.join(", ")),
        ),
        Unpaired::DuplicateCall { id, .. } => ApiError::param(
            "input",
            format!("Duplicate 'call_id': {id}. Each `function_call` of a turn needs its own call_id, which its `function_call_output` answers"),
        ),
    }
}

pub fn messages(u: Unpaired) -> ApiError {
    match u {
        Unpaired::UnknownResult { id, .. } => ApiError::param(
            "messages",
            format!("unexpected `tool_use_id` found in `tool_result` blocks: {id}. Each `tool_result` block must have a corresponding `tool_use` block in the previous message"),
        ),
        Unpaired::Unanswered { ids, .. } => ApiError::param(
            "messages",
            format!("`tool_use` ids were found without `tool_result` blocks immediately after: {}. Each `tool_use` block must have a corresponding `tool_result` block in the next message", ids.join(", ")),
        ),
        Unpaired::DuplicateCall { id, .. } => ApiError::param(
            "messages",
            format!("`tool_use` ids must be unique: {id} is given to more than one `tool_use` block of one message"),
        ),
    }
}
