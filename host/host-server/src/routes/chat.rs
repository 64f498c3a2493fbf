//! `POST /v1/chat/completions`: messages (tool calls and results
//! included) through the model's chat template; plain text, structured
//! output, or tool calls back.

use super::{json_object, top_count};
use crate::assemble::Assembler;
use crate::choice::ChoiceOut;
use crate::error::ApiError;
use crate::gen;
use crate::respond::{self, Api, Ctx};
use crate::state::{unix_now, AppState};
use crate::structured::{self, Requested};
use crate::wire::{Common, Fields};
use axum::body::Bytes;
use axum::extract::State;
use axum::response::Response;
use host_engine::constraint::Grammar;
use host_tools::{ToolCallParser, ToolChoice, ToolError, ToolRequest, ToolSyntax};
use serde_json::Value;

/// A 400 naming the parameter in `param` and in the message (OpenAI's
/// messages say which field is wrong).
fn tool_error(e: ToolError) -> ApiError {
    ApiError::param(&e.param, format!("`{}`: {}", e.param, e.message))
}

pub async fn handler(State(st): State<AppState>, body: Bytes) -> Result<Response, ApiError> {
    let obj = json_object(&body)?;
    let f = Fields(&obj);
    let messages = match f.value("messages") {
        None => return Err(ApiError::param("messages", "`messages` is required")),
        Some(Value::Array(a)) if a.is_empty() => {
            return Err(ApiError::param("messages", "`messages` must not be empty"))
        }
        Some(Value::Array(a)) => a,
        Some(_) => return Err(ApiError::param("messages", "`messages` must be an array")),
    };
    let normalized = host_tools::template_messages(messages).map_err(tool_error)?;
    let tools = ToolRequest::from_body(&Value::Object(obj.clone())).map_err(tool_error)?;
    let common = Common::parse(&f, "max_tokens")?;
    let wants = f.boolean("logprobs")?;
    let top = top_count(f.value("top_logprobs"), 20, "top_logprobs")?;
    if top.is_some() && !wants {
        return Err(ApiError::param("top_logprobs", "`top_logprobs` requires `logprobs: true`"));
    }
    let logprobs = wants.then(|| top.unwrap_or(0));
    let mut kwargs = match f.value("chat_template_kwargs") {
        None => serde_json::Map::new(),
        Some(Value::Object(o)) => o.clone(),
        Some(_) => return Err(ApiError::param("chat_template_kwargs", "`chat_template_kwargs` must be an object")),
    };
    let text = st
        .text
        .clone()
        .ok_or_else(|| ApiError::invalid("this model has no tokenizer: use /v1/completions with token ids"))?;
    let template = text
        .template
        .as_ref()
        .ok_or_else(|| ApiError::invalid("this model has no chat template: use /v1/completions"))?;
    // The template sees the tools as the client sent them (HF templates
    // take OpenAI's function-tool objects).
    if !tools.tools.is_empty() {
        kwargs.insert("tools".into(), f.value("tools").cloned().unwrap_or(Value::Null));
    }
    let rendered = template
        .render(&Value::Array(normalized), true, &kwargs)
        .map_err(|e| ApiError::param("messages", e.to_string()))?;
    let prompt = text.encode_rendered(&rendered).map_err(|e| ApiError::invalid(e.to_string()))?;
    let (grammar, syntax) = plan_tools(&st, &tools, structured::requested(&f)?)?;
    let reqs = gen::requests(&st, &common, prompt, logprobs, grammar.as_ref())?;
    let id = st.next_id("chatcmpl");
    let mut runs = Vec::with_capacity(reqs.len());
    for (i, req) in reqs.into_iter().enumerate() {
        let out = match syntax {
            Some(syntax) => ChoiceOut::new(
                i,
                Assembler::keeping_special(text.clone(), common.stop.clone()),
                Some(ToolCallParser::new(syntax).with_tools(&tools.tools)),
            ),
            None => ChoiceOut::new(i, Assembler::new(text.clone(), common.stop.clone()), None),
        };
        runs.push((gen::submit(&st, &id, req)?, out));
    }
    let ctx =
        Ctx { st: st.clone(), api: Api::Chat, id, created: unix_now(), logprobs, include_usage: common.include_usage };
    if common.stream {
        Ok(respond::stream(ctx, runs))
    } else {
        respond::complete(ctx, runs).await
    }
}

/// The grammar the answer follows and the syntax its tool calls are read
/// in. `required` or a named function: a grammar that writes the calls in
/// the model's own syntax (plain JSON when its template has none). `auto`:
/// the model's syntax parsed out of its text, under the request's own
/// structured output if it asked for one. `none` or no tools: no parsing.
fn plan_tools(
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
