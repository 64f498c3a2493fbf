//! `POST /v1/completions`: raw text (or token ids) in, text out; with
//! `suffix`, fill-in-the-middle for tokenizers that have its markers.

use super::{json_object, top_count};
use crate::assemble::Assembler;
use crate::choice::ChoiceOut;
use crate::error::ApiError;
use crate::fim::{self, FimTokens};
use crate::gen;
use crate::respond::{self, Api, Ctx};
use crate::state::{unix_now, AppState};
use crate::structured;
use crate::wire::{Common, Fields};
use axum::body::Bytes;
use axum::extract::State;
use axum::response::Response;
use host_engine::tokenizer::TextSide;
use serde_json::Value;

/// `prompt` as the client sent it.
enum Prompt {
    Text(String),
    Ids(Vec<u32>),
}

/// `prompt`: a string, a one-element array of strings, or token ids.
fn prompt_input(v: Option<&Value>) -> Result<Prompt, ApiError> {
    let ids = |a: &Vec<Value>| -> Result<Prompt, ApiError> {
        a.iter()
            .map(|x| {
                x.as_u64().filter(|n| *n < u32::MAX as u64).map(|n| n as u32).ok_or_else(|| {
                    ApiError::param("prompt", format!("token ids must be integers from 0 to {}, got {x}", u32::MAX - 1))
                })
            })
            .collect::<Result<_, _>>()
            .map(Prompt::Ids)
    };
    match v {
        None => Err(ApiError::param("prompt", "`prompt` is required")),
        Some(Value::String(s)) => Ok(Prompt::Text(s.clone())),
        Some(Value::Array(a)) if a.is_empty() => Err(ApiError::param("prompt", "`prompt` must not be empty")),
        Some(Value::Array(a)) if a.iter().all(Value::is_number) => ids(a),
        Some(Value::Array(a)) if a.len() == 1 => match &a[0] {
            Value::String(s) => Ok(Prompt::Text(s.clone())),
            Value::Array(inner) => ids(inner),
            _ => Err(ApiError::param("prompt", "`prompt` must be a string, an array of strings, or token ids")),
        },
        Some(Value::Array(a)) if a.iter().all(|x| x.is_string() || x.is_array()) => {
            Err(ApiError::unsupported("prompt", "several prompts in one request are not supported (send one)"))
        }
        Some(Value::Array(_)) => Err(ApiError::param(
            "prompt",
            "`prompt` must be a string, an array of strings, or token ids (an array mixes kinds)",
        )),
        Some(_) => Err(ApiError::param("prompt", "`prompt` must be a string, an array of strings, or token ids")),
    }
}

fn text_side(st: &AppState) -> Result<&TextSide, ApiError> {
    st.text.as_deref().ok_or_else(|| ApiError::param("prompt", "this model has no tokenizer: send token ids"))
}

/// The prompt's token ids: text through the tokenizer as a plain prompt.
fn prompt_ids(st: &AppState, prompt: Prompt) -> Result<Vec<u32>, ApiError> {
    match prompt {
        Prompt::Ids(ids) => Ok(ids),
        Prompt::Text(s) => text_side(st)?.encode_prompt(&s).map_err(|e| ApiError::param("prompt", e.to_string())),
    }
}

/// Fill-in-the-middle: the prompt is the text before the hole, `suffix`
/// the text after it, arranged with the tokenizer's FIM markers (each part
/// encoded without added special tokens; BOS first when the tokenizer asks
/// for one).
fn infill(st: &AppState, prompt: Prompt, suffix: &str) -> Result<Vec<u32>, ApiError> {
    let fim = FimTokens::find(&st.tools.added_tokens).ok_or_else(|| ApiError::unsupported("suffix", fim::NEEDS))?;
    let text = text_side(st)?;
    let encode = |s: &str, param: &str| text.encode_rendered(s).map_err(|e| ApiError::param(param, e.to_string()));
    let prefix = match prompt {
        Prompt::Ids(ids) => ids,
        Prompt::Text(s) => encode(&s, "prompt")?,
    };
    let bos = if text.add_bos { text.bos_token.as_deref().and_then(|t| text.tokenizer.token_to_id(t)) } else { None };
    Ok(fim.arrange(bos, &prefix, &encode(suffix, "suffix")?))
}

pub async fn handler(State(st): State<AppState>, body: Bytes) -> Result<Response, ApiError> {
    let obj = json_object(&body)?;
    let f = Fields(&obj);
    if f.boolean("echo")? {
        return Err(ApiError::unsupported("echo", "`echo` is not supported yet"));
    }
    let input = prompt_input(f.value("prompt"))?;
    let prompt = match f.value("suffix") {
        None => prompt_ids(&st, input)?,
        Some(Value::String(s)) if s.is_empty() => prompt_ids(&st, input)?,
        Some(Value::String(s)) => infill(&st, input, s)?,
        Some(_) => return Err(ApiError::param("suffix", "`suffix` must be a string")),
    };
    let common = Common::parse(&f, "max_tokens")?;
    let logprobs = top_count(f.value("logprobs"), 5, "logprobs")?;
    let grammar = structured::requested(&f)?;
    // The context checks name chat's `messages`; here the prompt is `prompt`.
    let reqs = gen::requests(&st, &common, prompt, logprobs, grammar.as_ref(), None)
        .map_err(|e| e.renamed("messages", "prompt"))?;
    let text = st.text.clone().ok_or_else(|| ApiError::invalid("this model has no tokenizer to decode its output"))?;
    let id = st.next_id("cmpl");
    let runs = gen::submit_all(&st, &id, reqs)?
        .into_iter()
        .enumerate()
        .map(|(i, run)| (run, ChoiceOut::new(i, Assembler::new(text.clone(), common.stop.clone()), None, None)))
        .collect();
    let ctx = Ctx {
        st: st.clone(),
        api: Api::Completion,
        id,
        created: unix_now(),
        logprobs,
        include_usage: common.include_usage,
    };
    if common.stream {
        Ok(respond::stream(ctx, runs))
    } else {
        respond::complete(ctx, runs).await
    }
}
