//! `POST /v1/completions`: raw text (or token ids) in, text out, for one
//! prompt or several; `echo` puts the prompt ahead of each choice's text;
//! with `suffix`, fill-in-the-middle for tokenizers that have its markers.

use super::{json_object, top_count};
use crate::assemble::Assembler;
use crate::choice::{ChoiceOut, Echo};
use crate::error::ApiError;
use crate::fim::{self, FimTokens};
use crate::gen;
use crate::respond::{self, Api, Ctx};
use crate::state::{unix_now, AppState};
use crate::structured;
use crate::wire::{Common, Fields, MAX_N};
use axum::body::Bytes;
use axum::extract::State;
use axum::response::Response;
use host_engine::tokenizer::TextSide;
use host_engine::{InputOut, InputTask};
use serde_json::Value;

/// `prompt` as the client sent it.
enum Prompt {
    Text(String),
    Ids(Vec<u32>),
}

/// `prompt`: a string, token ids, or an array of strings or of token-id
/// arrays (several prompts, each answered by `n` consecutive choices).
fn prompt_inputs(v: Option<&Value>) -> Result<Vec<Prompt>, ApiError> {
    const KINDS: &str = "`prompt` must be a string, token ids, or an array of strings or of token-id arrays";
    let ids = |a: &Vec<Value>| -> Result<Prompt, ApiError> {
        if a.is_empty() {
            return Err(ApiError::param("prompt", "a prompt of token ids must not be empty"));
        }
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
        Some(Value::String(s)) => Ok(vec![Prompt::Text(s.clone())]),
        Some(Value::Array(a)) if a.is_empty() => Err(ApiError::param("prompt", "`prompt` must not be empty")),
        Some(Value::Array(a)) if a.iter().all(Value::is_number) => Ok(vec![ids(a)?]),
        Some(Value::Array(a)) if a.iter().all(Value::is_string) => {
            Ok(a.iter().filter_map(Value::as_str).map(|s| Prompt::Text(s.to_owned())).collect())
        }
        Some(Value::Array(a)) if a.iter().all(Value::is_array) => {
            a.iter().filter_map(Value::as_array).map(ids).collect()
        }
        Some(Value::Array(_)) => Err(ApiError::param("prompt", format!("{KINDS} (this array mixes kinds)"))),
        Some(_) => Err(ApiError::param("prompt", KINDS)),
    }
}

fn text_side(st: &AppState) -> Result<&TextSide, ApiError> {
    st.text.as_deref().ok_or_else(|| ApiError::param("prompt", "this model has no tokenizer: send token ids"))
}

/// The prompt's token ids: text through the tokenizer as a plain prompt.
fn prompt_ids(st: &AppState, prompt: &Prompt) -> Result<Vec<u32>, ApiError> {
    match prompt {
        Prompt::Ids(ids) => Ok(ids.clone()),
        Prompt::Text(s) => text_side(st)?.encode_prompt(s).map_err(|e| ApiError::param("prompt", e.to_string())),
    }
}

/// `echo`'s text: the prompt as sent, token ids decoded with their special
/// tokens written out.
fn echo_text(st: &AppState, prompt: &Prompt) -> Result<String, ApiError> {
    match prompt {
        Prompt::Text(s) => Ok(s.clone()),
        Prompt::Ids(ids) => text_side(st)?
            .tokenizer
            .decode(ids, false)
            .map_err(|e| ApiError::param("prompt", format!("the prompt's token ids do not decode: {e}"))),
    }
}

/// Fill-in-the-middle: the prompt is the text before the hole, `suffix`
/// the text after it, arranged with the tokenizer's FIM markers (each part
/// encoded without added special tokens; BOS first when the tokenizer asks
/// for one).
fn infill(st: &AppState, prompt: &Prompt, suffix: &str) -> Result<Vec<u32>, ApiError> {
    let fim = FimTokens::find(&st.tools.added_tokens).ok_or_else(|| ApiError::unsupported("suffix", fim::NEEDS))?;
    let text = text_side(st)?;
    let encode = |s: &str, param: &str| text.encode_rendered(s).map_err(|e| ApiError::param(param, e.to_string()));
    let prefix = match prompt {
        Prompt::Ids(ids) => ids.clone(),
        Prompt::Text(s) => encode(s, "prompt")?,
    };
    let bos = if text.add_bos { text.bos_token.as_deref().and_then(|t| text.tokenizer.token_to_id(t)) } else { None };
    Ok(fim.arrange(bos, &prefix, &encode(suffix, "suffix")?))
}

/// What `echo` shows of each prompt: its text, and with `logprobs` its
/// tokens scored by the model (one whole-input job for every prompt).
async fn echoes(
    st: &AppState,
    inputs: &[Prompt],
    prompts: Vec<Vec<u32>>,
    logprobs: Option<usize>,
) -> Result<Vec<Echo>, ApiError> {
    let mut scores = match logprobs {
        Some(top) => match gen::run_inputs(st, prompts, InputTask::Score { top }, "prompt scoring").await? {
            InputOut::Scores(s) => s,
            InputOut::Vectors(_) => return Err(ApiError::internal("the engine answered a scoring job with vectors")),
        },
        None => vec![Vec::new(); inputs.len()],
    };
    inputs
        .iter()
        .zip(scores.iter_mut())
        .map(|(input, scores)| Ok(Echo { text: echo_text(st, input)?, scores: std::mem::take(scores) }))
        .collect()
}

pub async fn handler(State(st): State<AppState>, body: Bytes) -> Result<Response, ApiError> {
    let obj = json_object(&body)?;
    let f = Fields(&obj);
    let inputs = prompt_inputs(f.value("prompt"))?;
    let suffix = match f.value("suffix") {
        None => None,
        Some(Value::String(s)) if s.is_empty() => None,
        Some(Value::String(s)) => Some(s.as_str()),
        Some(_) => return Err(ApiError::param("suffix", "`suffix` must be a string")),
    };
    let common = Common::parse(&f, "max_tokens")?;
    let logprobs = top_count(f.value("logprobs"), 5, "logprobs")?;
    let echo = f.boolean("echo")?;
    if echo && suffix.is_some() {
        return Err(ApiError::param("echo", "`echo` cannot be used with `suffix`"));
    }
    if inputs.len() * common.n > MAX_N as usize {
        return Err(ApiError::param(
            "prompt",
            format!("{} prompts x n = {} choices; one request makes at most {MAX_N}", inputs.len(), common.n),
        ));
    }
    let grammar = structured::requested(&f)?;
    let text = st.text.clone().ok_or_else(|| ApiError::invalid("this model has no tokenizer to decode its output"))?;
    // `echo` with `max_tokens: 0` only shows (and scores) the prompts; each
    // is checked as a one-token completion would be.
    let echo_only = echo && common.max_tokens == Some(0);
    let checked = if echo_only { Common { max_tokens: Some(1), ..common.clone() } } else { common.clone() };
    let mut reqs = Vec::with_capacity(inputs.len() * common.n);
    let mut prompts = Vec::with_capacity(inputs.len());
    for input in &inputs {
        let prompt = match suffix {
            None => prompt_ids(&st, input)?,
            Some(s) => infill(&st, input, s)?,
        };
        // The context checks name chat's `messages`; here the prompt is `prompt`.
        reqs.extend(
            gen::requests(&st, &checked, prompt.clone(), logprobs, grammar.as_ref(), None)
                .map_err(|e| e.renamed("messages", "prompt"))?,
        );
        prompts.push(prompt);
    }
    // Per choice: its prompt's length and what `echo` shows of it.
    let lengths: Vec<usize> = prompts.iter().flat_map(|p| std::iter::repeat_n(p.len(), common.n)).collect();
    let echoes: Vec<Option<Echo>> = if echo {
        echoes(&st, &inputs, prompts, logprobs).await?.into_iter().map(Some).collect()
    } else {
        vec![None; inputs.len()]
    };
    let echoes = echoes.into_iter().flat_map(|e| std::iter::repeat_n(e, common.n));
    let ctx = Ctx {
        st: st.clone(),
        api: Api::Completion,
        id: st.next_id("cmpl"),
        created: unix_now(),
        logprobs,
        include_usage: common.include_usage,
        per_prompt: common.n,
    };
    if echo_only {
        return Ok(respond::echo_only(ctx, echoes.flatten().collect(), &lengths, common.stream));
    }
    let runs = gen::submit_all(&st, &ctx.id, reqs)?
        .into_iter()
        .zip(echoes)
        .enumerate()
        .map(|(i, (run, echo))| {
            let out = ChoiceOut::new(i, Assembler::new(text.clone(), common.stop.clone()), None, None);
            (
                run,
                match echo {
                    Some(e) => out.echoing(e),
                    None => out,
                },
            )
        })
        .collect();
    if common.stream {
        Ok(respond::stream(ctx, runs))
    } else {
        respond::complete(ctx, runs).await
    }
}
