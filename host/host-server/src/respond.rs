//! Turning running jobs (one per choice) into the OpenAI response: one
//! JSON body, or an SSE stream of chunks ending in `data: [DONE]`. Both
//! share the per-choice output (detokenizing, stop strings, tool calls) and
//! the usage and logprobs formats.

use crate::choice::{Call, ChoiceOut, Echo, Piece};
use crate::error::ApiError;
use crate::gen::Running;
use crate::keepalive::{self, Next, Quiet};
use crate::state::{AppState, ServerStats};
use axum::body::{Body, Bytes};
use axum::response::{IntoResponse, Response};
use host_engine::Event;
use host_engine::{Finish, TokenOut};
use serde_json::{json, Value};
use std::convert::Infallible;
use std::sync::atomic::Ordering;

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Chat,
    Completion,
}

pub struct Ctx {
    pub st: AppState,
    pub api: Api,
    pub id: String,
    pub created: u64,
    /// Report logprobs with this many alternatives.
    pub logprobs: Option<usize>,
    pub include_usage: bool,
    /// Choices per prompt (`n`): a completion may carry several prompts,
    /// each answered by `n` consecutive choices.
    pub per_prompt: usize,
}

impl Ctx {
    /// Usage over every choice: each prompt once (its first choice's
    /// prompt and cached tokens), the completions summed; the first
    /// choice's speculation report. `prompts`: each choice's prompt length.
    /// `reasoning`: the tokens every choice wrote inside its reasoning block.
    fn usage(&self, prompts: &[usize], results: &[&host_engine::GenerateResult], reasoning: usize) -> Value {
        let step = self.per_prompt.max(1);
        let prompt: usize = prompts.iter().step_by(step).sum();
        let cached: usize = results.iter().step_by(step).map(|r| r.cached_tokens).sum();
        let completion: usize = results.iter().map(|r| r.tokens.len()).sum();
        let first = results.first();
        let mut u = json!({
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": { "cached_tokens": cached },
            "completion_tokens_details": { "reasoning_tokens": reasoning },
        });
        if let Some(sp) = first.and_then(|r| r.speculation.as_ref()) {
            u["speculation"] = sp.report();
        }
        u
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.api, chunk) {
            (Api::Chat, false) => "chat.completion",
            (Api::Chat, true) => "chat.completion.chunk",
            (Api::Completion, _) => "text_completion",
        }
    }

    fn token_text(&self, id: u32) -> String {
        self.st.text.as_ref().map(|t| t.token_str(id)).unwrap_or_default()
    }

    /// Chat-style logprob entries for these tokens.
    fn chat_logprobs(&self, toks: &[TokenOut]) -> Value {
        let entry = |id: u32, lp: f32| {
            let t = self.token_text(id);
            json!({ "token": t, "logprob": lp, "bytes": t.as_bytes() })
        };
        let content: Vec<Value> = toks
            .iter()
            .map(|t| {
                let mut e = entry(t.id, t.logprob.unwrap_or(f32::NAN));
                e["top_logprobs"] = json!(t.top.iter().map(|(i, l)| entry(*i, *l)).collect::<Vec<_>>());
                e
            })
            .collect();
        json!({ "content": content })
    }

    /// Completions-style logprobs (`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`).
    fn completion_logprobs(&self, toks: &[TokenOut], offset: &mut usize) -> Value {
        let mut tokens = Vec::new();
        let mut lps = Vec::new();
        let mut tops = Vec::new();
        let mut offs = Vec::new();
        for t in toks {
            let s = self.token_text(t.id);
            offs.push(*offset);
            *offset += s.len();
            tokens.push(s);
            lps.push(t.logprob);
            let m: serde_json::Map<String, Value> =
                t.top.iter().map(|(i, l)| (self.token_text(*i), json!(l))).collect();
            tops.push(Value::Object(m));
        }
        json!({ "tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offs })
    }

    fn logprobs_value(&self, toks: &[TokenOut], offset: &mut usize) -> Value {
        match (self.logprobs, self.api) {
            (None, _) => Value::Null,
            (Some(_), Api::Chat) => self.chat_logprobs(toks),
            (Some(_), Api::Completion) => self.completion_logprobs(toks, offset),
        }
    }
}

fn finish_reason(c: &ChoiceOut, finish: Finish) -> &'static str {
    if c.stopped() {
        return "stop";
    }
    match finish {
        Finish::Stop if !c.calls.is_empty() => "tool_calls",
        Finish::Stop => "stop",
        Finish::Length => "length",
    }
}

pub(crate) fn log_done(id: &str, run: &Running, completion: usize, first_token_ms: Option<u128>, finish: &str) {
    // Decode rate: tokens after the first, over the time after the first.
    let ttft = first_token_ms.unwrap_or(0) as f64 / 1e3;
    let secs = run.started.elapsed().as_secs_f64() - ttft;
    let tps = completion.saturating_sub(1) as f64 / secs.max(1e-9);
    tracing::info!(
        id,
        prompt_tokens = run.prompt_tokens,
        completion_tokens = completion,
        ttft_ms = first_token_ms.unwrap_or(0) as u64,
        tokens_per_s = format!("{tps:.1}"),
        finish,
        "request done"
    );
}

/// A tool call as a message's `tool_calls` entry.
fn call_json(c: &Call) -> Value {
    json!({ "id": c.id, "type": "function", "function": { "name": c.name, "arguments": c.arguments } })
}

/// Waits for every choice and returns one JSON body.
pub async fn complete(ctx: Ctx, runs: Vec<(Running, ChoiceOut)>) -> Result<Response, ApiError> {
    let prompt_tokens: Vec<usize> = runs.iter().map(|(r, _)| r.prompt_tokens).collect();
    let mut choices = Vec::with_capacity(runs.len());
    let mut results = Vec::with_capacity(runs.len());
    let mut reasoning_tokens = 0;
    for (mut run, mut c) in runs {
        let echo = c.echo.take();
        let mut text = echo.as_ref().map(|e| e.text.clone()).unwrap_or_default();
        let mut reasoning: Option<String> = None;
        let mut first_ms = None;
        let mut take = |pieces: Vec<Piece>, text: &mut String| {
            for p in pieces {
                match p {
                    Piece::Text(s) => text.push_str(&s),
                    Piece::Reasoning(s) => reasoning.get_or_insert_with(String::new).push_str(&s),
                    Piece::Call(_) => {}
                }
            }
        };
        let result = loop {
            match run.events.recv().await {
                Some(Event::Token(t)) => {
                    first_ms.get_or_insert_with(|| run.started.elapsed().as_millis());
                    let pieces = c.push(&t);
                    take(pieces, &mut text);
                    if c.stopped() {
                        ServerStats::bump(&ctx.st.stats.stop_string_hits);
                        run.stop.store(true, Ordering::SeqCst);
                    }
                }
                Some(Event::Done(r)) => break r,
                Some(Event::Failed(e)) => return Err(ApiError::generation_failed(&e)),
                None => return Err(ApiError::internal("the engine dropped the request")),
            }
        };
        let pieces = c.finish();
        take(pieces, &mut text);
        reasoning_tokens += c.reasoning_tokens;
        let finish = finish_reason(&c, result.finish);
        log_done(&ctx.id, &run, result.tokens.len(), first_ms, finish);
        let mut offset = 0;
        let mut toks = echo.map(|e| e.scores).unwrap_or_default();
        toks.append(&mut c.toks);
        let logprobs = ctx.logprobs_value(&toks, &mut offset);
        choices.push(match ctx.api {
            Api::Chat => {
                let mut message = json!({ "role": "assistant", "content": text });
                if let Some(r) = reasoning {
                    message["reasoning_content"] = json!(r);
                }
                if !c.calls.is_empty() {
                    if text.trim().is_empty() {
                        message["content"] = Value::Null;
                    }
                    message["tool_calls"] = c.calls.iter().map(call_json).collect();
                }
                json!({ "index": c.index, "message": message, "logprobs": logprobs, "finish_reason": finish })
            }
            Api::Completion => json!({ "index": c.index, "text": text, "logprobs": logprobs, "finish_reason": finish }),
        });
        results.push(result);
    }
    let body = json!({
        "id": ctx.id,
        "object": ctx.object(false),
        "created": ctx.created,
        "model": ctx.st.cfg.model_id,
        "choices": choices,
        "usage": ctx.usage(&prompt_tokens, &results.iter().collect::<Vec<_>>(), reasoning_tokens),
    });
    Ok(axum::Json(body).into_response())
}

/// Completions' `echo` with `max_tokens: 0`: each prompt shown (and
/// scored), nothing generated, `finish_reason` "length"; whole, or as one
/// chunk per choice. `prompts`: each choice's prompt length.
pub fn echo_only(ctx: Ctx, echoes: Vec<Echo>, prompts: &[usize], stream: bool) -> Response {
    let choices: Vec<Value> = echoes
        .into_iter()
        .enumerate()
        .map(|(i, e)| {
            let lp = ctx.logprobs_value(&e.scores, &mut 0);
            json!({ "index": i, "text": e.text, "logprobs": lp, "finish_reason": "length" })
        })
        .collect();
    let usage = ctx.usage(prompts, &[], 0);
    let head = |choices: Vec<Value>| json!({ "id": ctx.id, "object": ctx.object(stream), "created": ctx.created, "model": ctx.st.cfg.model_id, "choices": choices });
    if !stream {
        let mut body = head(choices);
        body["usage"] = usage;
        return axum::Json(body).into_response();
    }
    let mut events = Vec::with_capacity(choices.len() + 2);
    for c in choices {
        let mut chunk = head(vec![c]);
        if ctx.include_usage {
            chunk["usage"] = Value::Null;
        }
        events.push(sse(&chunk));
    }
    if ctx.include_usage {
        let mut last = head(Vec::new());
        last["usage"] = usage;
        events.push(sse(&last));
    }
    events.push(Bytes::from_static(b"data: [DONE]\n\n"));
    crate::sse::response(Body::from_stream(tokio_stream::iter(events.into_iter().map(Ok::<_, Infallible>))))
}

fn sse(v: &Value) -> Bytes {
    Bytes::from(format!("data: {}\n\n", serde_json::to_string(v).unwrap_or_default()))
}

/// Streams chunks as they come, each choice's under its index. When the
/// client goes away the body is dropped, the pump's send fails, it drops
/// the event receivers, and the engine stops the jobs at their next step.
pub fn stream(ctx: Ctx, runs: Vec<(Running, ChoiceOut)>) -> Response {
    let (tx, response) = crate::sse::open();
    // Every choice's events into one channel, tagged with the choice.
    let (merged_tx, mut merged) = tokio::sync::mpsc::unbounded_channel::<(usize, Event)>();
    let mut choices = Vec::with_capacity(runs.len());
    for (i, (mut run, c)) in runs.into_iter().enumerate() {
        let events = std::mem::replace(&mut run.events, tokio::sync::mpsc::unbounded_channel().1);
        let fwd = merged_tx.clone();
        tokio::spawn(forward(i, events, fwd));
        choices.push((run, c));
    }
    drop(merged_tx);
    tokio::spawn(async move {
        let chunk = |choice: Value| -> Value {
            let mut c = json!({ "id": ctx.id, "object": ctx.object(true), "created": ctx.created, "model": ctx.st.cfg.model_id, "choices": [choice] });
            if ctx.include_usage {
                c["usage"] = Value::Null;
            }
            c
        };
        let text_delta = |index: usize, text: String, lp: Value| -> Value {
            match ctx.api {
                Api::Chat => {
                    json!({ "index": index, "delta": { "content": text }, "logprobs": lp, "finish_reason": null })
                }
                Api::Completion => json!({ "index": index, "text": text, "logprobs": lp, "finish_reason": null }),
            }
        };
        // A call as OpenAI streams it: id, type and name with empty
        // arguments, then the arguments.
        let call_deltas = |index: usize, c: &Call| -> [Value; 2] {
            let head = json!({ "index": c.index, "id": c.id, "type": "function", "function": { "name": c.name, "arguments": "" } });
            let args = json!({ "index": c.index, "function": { "arguments": c.arguments } });
            [head, args].map(|tc| json!({ "index": index, "delta": { "tool_calls": [tc] }, "logprobs": null, "finish_reason": null }))
        };
        let last = |index: usize, finish: &str| -> Value {
            match ctx.api {
                Api::Chat => json!({ "index": index, "delta": {}, "logprobs": null, "finish_reason": finish }),
                Api::Completion => json!({ "index": index, "text": "", "logprobs": null, "finish_reason": finish }),
            }
        };
        let send_pieces = |index: usize, pieces: Vec<Piece>, mut lp: Value| -> Vec<Value> {
            let mut out = Vec::new();
            for p in pieces {
                match p {
                    Piece::Text(s) => out.push(chunk(text_delta(index, s, std::mem::take(&mut lp)))),
                    Piece::Reasoning(s) => out.push(chunk(json!({
                        "index": index, "delta": { "reasoning_content": s },
                        "logprobs": std::mem::take(&mut lp), "finish_reason": null,
                    }))),
                    Piece::Call(c) => out.extend(call_deltas(index, &c).map(&chunk)),
                }
            }
            if !lp.is_null() {
                out.push(chunk(text_delta(index, String::new(), lp)));
            }
            out
        };
        // Completions' `echo`: the prompt (and its tokens' logprobs) first.
        for (i, (_, c)) in choices.iter_mut().enumerate() {
            if let Some(e) = c.echo.take() {
                let lp = ctx.logprobs_value(&e.scores, &mut c.offset);
                if tx.send(Ok(sse(&chunk(text_delta(i, e.text, lp))))).await.is_err() {
                    return;
                }
            }
        }
        if ctx.api == Api::Chat {
            for (i, _) in choices.iter().enumerate() {
                let first = chunk(
                    json!({ "index": i, "delta": { "role": "assistant", "content": "" }, "logprobs": null, "finish_reason": null }),
                );
                if tx.send(Ok(sse(&first))).await.is_err() {
                    return;
                }
            }
        }
        let mut first_ms: Vec<Option<u128>> = vec![None; choices.len()];
        let mut reasoning_tokens = 0;
        let mut results: Vec<Option<host_engine::GenerateResult>> = (0..choices.len()).map(|_| None).collect();
        let mut quiet = Quiet::new(ctx.st.cfg.sse_keepalive);
        loop {
            let (i, ev) = match quiet.next(&mut merged).await {
                Next::Item(x) => x,
                Next::Closed => break,
                Next::KeepAlive => {
                    if tx.send(Ok(Bytes::from_static(keepalive::COMMENT))).await.is_err() {
                        return;
                    }
                    continue;
                }
            };
            let (run, c) = &mut choices[i];
            let out = match ev {
                Event::Token(t) => {
                    first_ms[i].get_or_insert_with(|| run.started.elapsed().as_millis());
                    let pieces = c.push(&t);
                    if c.stopped() && !run.stop.swap(true, Ordering::SeqCst) {
                        ServerStats::bump(&ctx.st.stats.stop_string_hits);
                    }
                    let lp = if c.stopped() {
                        Value::Null
                    } else {
                        let mut offset = c.offset;
                        let v = ctx.logprobs_value(std::slice::from_ref(&t), &mut offset);
                        c.offset = offset;
                        v
                    };
                    send_pieces(i, pieces, lp)
                }
                Event::Done(r) => {
                    let mut out = send_pieces(i, c.finish(), Value::Null);
                    let finish = finish_reason(c, r.finish);
                    log_done(&ctx.id, run, r.tokens.len(), first_ms[i], finish);
                    reasoning_tokens += c.reasoning_tokens;
                    out.push(chunk(last(i, finish)));
                    results[i] = Some(r);
                    out
                }
                Event::Failed(e) => {
                    let err = ApiError::generation_failed(&e);
                    let _ = tx.send(Ok(sse(&err.body()))).await;
                    let _ = tx.send(Ok(Bytes::from_static(b"data: [DONE]\n\n"))).await;
                    return;
                }
            };
            if !out.is_empty() {
                quiet.sent();
            }
            for v in out {
                if tx.send(Ok(sse(&v))).await.is_err() {
                    return; // client gone: dropping the receivers cancels the jobs
                }
            }
        }
        let done: Vec<&host_engine::GenerateResult> = results.iter().flatten().collect();
        if done.len() < choices.len() {
            let err = ApiError::internal("the engine dropped the request");
            let _ = tx.send(Ok(sse(&err.body()))).await;
        } else if ctx.include_usage {
            let prompts: Vec<usize> = choices.iter().map(|(r, _)| r.prompt_tokens).collect();
            let mut u = json!({ "id": ctx.id, "object": ctx.object(true), "created": ctx.created, "model": ctx.st.cfg.model_id, "choices": [] });
            u["usage"] = ctx.usage(&prompts, &done, reasoning_tokens);
            let _ = tx.send(Ok(sse(&u))).await;
        }
        let _ = tx.send(Ok(Bytes::from_static(b"data: [DONE]\n\n"))).await;
    });
    response
}

/// Moves one choice's events into the merged channel until its job ends or
/// the stream is gone (then dropping `events` stops the job).
async fn forward(
    index: usize,
    mut events: tokio::sync::mpsc::UnboundedReceiver<Event>,
    to: tokio::sync::mpsc::UnboundedSender<(usize, Event)>,
) {
    while let Some(ev) = events.recv().await {
        let end = matches!(ev, Event::Done(_) | Event::Failed(_));
        if to.send((index, ev)).is_err() || end {
            return;
        }
    }
}
