//! OpenAI tool calling, with no model in sight: what the HTTP server needs
//! to read a request's tools (`request`), know how the model writes calls
//! (`syntax`), find calls in its text as it streams (`parse`), force calls
//! with a grammar (`grammar`) and hand the conversation to a chat template
//! (`messages`, with each tool result paired to its call by `pairing`; past calls as text for a template without a syntax,
//! `inline_calls`). Pure functions over text and JSON; no MLX, no tokenizer.

mod call_id;
mod decode;
mod decoded;
mod error;
mod gemma_call;
mod grammar;
mod grammar_args;
mod grammar_pieces;
mod inline_calls;
mod json_scan;
mod messages;
mod pairing;
mod parse;
mod request;
mod syntax;
mod xml_call;

pub use call_id::new_call_id;
pub use error::ToolError;
pub use grammar::{calls_grammar, tool_choice_grammar};
pub use inline_calls::inline_calls;
pub use messages::template_messages;
pub use pairing::{pair_tool_results, Unpaired};
pub use parse::{parse_complete, Call, ParsedEvent, ToolCallParser};
pub use request::{parse_parallel_tool_calls, parse_tool_choice, parse_tools, Tool, ToolChoice, ToolRequest};
pub use syntax::ToolSyntax;
