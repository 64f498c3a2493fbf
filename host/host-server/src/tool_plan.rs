//! What a request's tools mean for generation: the grammar its
//! `tool_choice` forces (in the model's own call syntax) and how each
//! choice's text is read back into calls. Shared by every endpoint with tools.

use crate::assemble::Assembler;
use crate::choice::ChoiceOut;
use crate::error::ApiError;
use crate::reasoning::Plan;
use crate::state::AppState;
use crate::structured::Requested;
use host_engine::constraint::Grammar;
use host_engine::tokenizer::TextSide;
use host_tools::{Tool, ToolCallParser, ToolChoice, ToolError, ToolRequest, ToolSyntax};
use std::sync::Arc;

/// A 400 naming the parameter in `param` and in the message (OpenAI's
/// messages say which field is wrong).
pub fn tool_error(e: ToolError) -> ApiError {
    ApiError::param(&e.param, format!("`{}`: {}", e.param, e.message))
}

/// The grammar the answer follows and the syntax its tool calls are read
/// in. `required` or a named function: a grammar that writes the calls in
/// the model's own syntax (plain JSON when its template has none). `auto`:
/// the model's syntax parsed out of its text, under the request's own
/// structured output if it asked for one. `none` or no tools: no parsing.
pub fn plan_tools(
    st: &AppState,
    tools: &ToolRequest,
    structured: Option<Requested>,
) -> Result<(Option<Requested>, Option<ToolSyntax>), ApiError> {
    if tools.tools.is_empty() || tools.choice == ToolChoice::None {
        return Ok((structured, None));
    }
    let syntax = st.tools.syntax;
    if tools.choice == ToolChoice::Auto {
        if !syntax.is_native() {
            return Err(ApiError::param(
                "tool_choice",
                "this model's chat template shows no tool-call syntax, so calls cannot be told apart from text: \
                 use tool_choice `required` or a named function (calls are then written under a grammar)",
            ));
        }
        return Ok((structured, Some(syntax)));
    }
    if let Some(s) = structured {
        return Err(ApiError::param(
            &s.param,
            "a structured output cannot be combined with tool_choice `required` or a named function",
        ));
    }
    let lark =
        host_tools::tool_choice_grammar(syntax, &tools.tools, &tools.choice, tools.parallel, &st.tools.added_tokens)
            .ok_or_else(|| ApiError::internal("no grammar for this tool_choice"))?;
    Ok((Some(Requested { grammar: Grammar::Lark(lark), param: "tool_choice".into() }), Some(syntax)))
}

/// One choice's output reader: the reasoning split when the model reasons
/// (`reasoning`, from the rendered prompt), the syntax's parser when calls
/// may appear, and special tokens kept in the text when markers may be
/// special.
pub fn choice_out(
    index: usize,
    text: Arc<TextSide>,
    stop: Vec<String>,
    syntax: Option<ToolSyntax>,
    tools: &[Tool],
    reasoning: Option<&Plan>,
) -> ChoiceOut {
    let keep_special = syntax.is_some() || reasoning.is_some_and(|p| p.markers.special);
    let asm = if keep_special { Assembler::keeping_special(text, stop) } else { Assembler::new(text, stop) };
    let parser = syntax.map(|syntax| ToolCallParser::new(syntax).with_tools(tools));
    ChoiceOut::new(index, asm, reasoning.map(Plan::splitter), parser)
}
