//! Turning a running job into the OpenAI response: one JSON body, or an
//! SSE stream of chunks ending in `data: [DONE]`. Both share the assembler
//! (detokenizing, stop strings) and the usage and logprobs formats.

use crate::assemble::Assembler;
use crate::error::ApiError;
use crate::gen::Running;
use crate::state::{AppState, ServerStats};
use axum::body::{Body, Bytes};
use axum::http::header;
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
}

impl Ctx {
    fn usage(&self, prompt: usize, r: &host_engine::GenerateResult) -> Value {
        let mut u = json!({
            "prompt_tokens": prompt,
            "completion_tokens": r.tokens.len(),
            "total_tokens": prompt + r.tokens.len(),
            "prompt_tokens_details": { "cached_tokens": r.cached_tokens },
        });
        if let Some(sp) = &r.speculation {
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

fn finish_reason(stopped_by_string: bool, finish: Finish) -> &'static str {
    if stopped_by_string {
        return "stop";
    }
    match finish {
        Finish::Stop => "stop",
        Finish::Length => "length",
    }
}

fn log_done(ctx: &Ctx, run: &Running, completion: usize, first_token_ms: Option<u128>, finish: &str) {
    // Decode rate: tokens after the first, over the time after the first.
    let ttft = first_token_ms.unwrap_or(0) as f64 / 1e3;
    let secs = run.started.elapsed().as_secs_f64() - ttft;
    let tps = completion.saturating_sub(1) as f64 / secs.max(1e-9);
    tracing::info!(id = %ctx.id, prompt_tokens = run.prompt_tokens, completion_tokens = completion, ttft_ms = first_token_ms.unwrap_or(0) as u64, tokens_per_s = format!("{tps:.1}"), finish, "request done");
}

/// Waits for the whole generation and returns one JSON body.
pub async fn complete(ctx: Ctx, mut run: Running, mut asm: Assembler) -> Result<Response, ApiError> {
    let mut text = String::new();
    let mut toks: Vec<TokenOut> = Vec::new();
    let mut first_ms = None;
    let result = loop {
        match run.events.recv().await {
            Some(Event::Token(t)) => {
                first_ms.get_or_insert_with(|| run.started.elapsed().as_millis());
                text.push_str(&asm.push(t.id));
                if asm.stopped {
                    ServerStats::bump(&ctx.st.stats.stop_string_hits);
                    run.stop.store(true, Ordering::SeqCst);
                }
                if !asm.stopped {
                    toks.push(t);
                }
            }
            Some(Event::Done(r)) => break r,
            Some(Event::Failed(e)) => return Err(ApiError::internal(format!("generation failed: {e}"))),
            None => return Err(ApiError::internal("the engine dropped the request")),
        }
    };
    text.push_str(&asm.finish());
    let finish = finish_reason(asm.stopped, result.finish);
    let completion = result.tokens.len();
    log_done(&ctx, &run, completion, first_ms, finish);
    let mut offset = 0;
    let logprobs = ctx.logprobs_value(&toks, &mut offset);
    let choice = match ctx.api {
        Api::Chat => {
            json!({ "index": 0, "message": { "role": "assistant", "content": text }, "logprobs": logprobs, "finish_reason": finish })
        }
        Api::Completion => json!({ "index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish }),
    };
    let body = json!({
        "id": ctx.id,
        "object": ctx.object(false),
        "created": ctx.created,
        "model": ctx.st.cfg.model_id,
        "choices": [choice],
        "usage": ctx.usage(run.prompt_tokens, &result),
    });
    Ok(axum::Json(body).into_response())
}

fn sse(v: &Value) -> Bytes {
    Bytes::from(format!("data: {}\n\n", serde_json::to_string(v).unwrap_or_default()))
}

/// Streams chunks as they come. When the client goes away the body is
/// dropped, the pump's send fails, it drops the event receiver, and the
/// engine stops the job at its next step.
pub fn stream(ctx: Ctx, mut run: Running, mut asm: Assembler) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, Infallible>>(64);
    tokio::spawn(async move {
        let chunk = |choice: Value, usage: Option<Value>| -> Value {
            let mut c = json!({ "id": ctx.id, "object": ctx.object(true), "created": ctx.created, "model": ctx.st.cfg.model_id, "choices": [choice] });
            if ctx.include_usage {
                c["usage"] = usage.unwrap_or(Value::Null);
            }
            c
        };
        let delta = |text: String, lp: Value, finish: Option<&str>| -> Value {
            match ctx.api {
                Api::Chat => {
                    let d = if finish.is_some() && text.is_empty() { json!({}) } else { json!({ "content": text }) };
                    json!({ "index": 0, "delta": d, "logprobs": lp, "finish_reason": finish })
                }
                Api::Completion => json!({ "index": 0, "text": text, "logprobs": lp, "finish_reason": finish }),
            }
        };
        if ctx.api == Api::Chat {
            let first = chunk(
                json!({ "index": 0, "delta": { "role": "assistant", "content": "" }, "logprobs": null, "finish_reason": null }),
                None,
            );
            if tx.send(Ok(sse(&first))).await.is_err() {
                return;
            }
        }
        let mut first_ms = None;
        let mut offset = 0;
        let result = loop {
            match run.events.recv().await {
                Some(Event::Token(t)) => {
                    first_ms.get_or_insert_with(|| run.started.elapsed().as_millis());
                    let text = asm.push(t.id);
                    if asm.stopped {
                        ServerStats::bump(&ctx.st.stats.stop_string_hits);
                        run.stop.store(true, Ordering::SeqCst);
                    }
                    let lp = if asm.stopped {
                        Value::Null
                    } else {
                        ctx.logprobs_value(std::slice::from_ref(&t), &mut offset)
                    };
                    if text.is_empty() && lp.is_null() {
                        continue;
                    }
                    if tx.send(Ok(sse(&chunk(delta(text, lp, None), None)))).await.is_err() {
                        return; // client gone: dropping `run` cancels the job
                    }
                }
                Some(Event::Done(r)) => break Ok(r),
                Some(Event::Failed(e)) => break Err(e),
                None => return,
            }
        };
        match result {
            Ok(r) => {
                let tail = asm.finish();
                if !tail.is_empty() {
                    let _ = tx.send(Ok(sse(&chunk(delta(tail, Value::Null, None), None)))).await;
                }
                let finish = finish_reason(asm.stopped, r.finish);
                log_done(&ctx, &run, r.tokens.len(), first_ms, finish);
                let _ = tx.send(Ok(sse(&chunk(delta(String::new(), Value::Null, Some(finish)), None)))).await;
                if ctx.include_usage {
                    let mut u = json!({ "id": ctx.id, "object": ctx.object(true), "created": ctx.created, "model": ctx.st.cfg.model_id, "choices": [] });
                    u["usage"] = ctx.usage(run.prompt_tokens, &r);
                    let _ = tx.send(Ok(sse(&u))).await;
                }
            }
            Err(e) => {
                let err = ApiError::internal(format!("generation failed: {e}"));
                let _ = tx.send(Ok(sse(&err.body()))).await;
            }
        }
        let _ = tx.send(Ok(Bytes::from_static(b"data: [DONE]\n\n"))).await;
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx)))
        .unwrap_or_else(|_| ApiError::internal("building the stream").into_response())
}
