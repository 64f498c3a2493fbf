//! An answer as Anthropic writes it: a `message` with content blocks
//! (`thinking`, `text`, `tool_use`), `stop_reason` and usage, whole or as
//! its event stream (`message_start`, `content_block_start` / `_delta`
//! (`thinking_delta` and `signature_delta`, `text_delta`,
//! `input_json_delta`) / `_stop`, `message_delta`, `message_stop`, and
//! `ping`s while nothing else is due).

use crate::answer::{arguments_value, Answer, Ended, Ending, Step};
use crate::choice::{Call, Piece};
use crate::error::AnthropicError;
use crate::keepalive::Quiet;
use crate::sse::{self, Events};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

/// Anthropic's `stop_reason` and `stop_sequence`.
fn stop(ending: &Ending) -> (&'static str, Value) {
    match ending {
        Ending::StopSequence(s) => ("stop_sequence", json!(s)),
        Ending::ToolCalls => ("tool_use", Value::Null),
        Ending::EndOfTurn => ("end_turn", Value::Null),
        Ending::MaxTokens => ("max_tokens", Value::Null),
    }
}

/// Anthropic counts input read from the cache apart from `input_tokens`
/// (the total input is their sum).
fn usage(prompt: usize, cached: usize, output: usize) -> Value {
    json!({
        "input_tokens": prompt - cached.min(prompt),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": output,
    })
}

/// Tool-use ids look like Anthropic's (`toolu_…`); clients send them back
/// as `tool_use_id` and nothing else reads them.
fn tool_use(c: &Call) -> Value {
    let id = format!("toolu_{}", c.id.trim_start_matches("call_"));
    json!({ "type": "tool_use", "id": id, "name": c.name, "input": arguments_value(c) })
}

/// A thinking block's `signature`. Anthropic's is a cryptographic check
/// that the thinking came from the model; this one is a digest of the text
/// (FNV-1a, 64 bits) that clients carry along as they would Anthropic's.
/// Thinking sent back in a history is taken as it is, signed or not.
fn signature(thinking: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in thinking.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    format!("fnv1a64:{h:016x}")
}

fn thinking_block(thinking: &str) -> Value {
    json!({ "type": "thinking", "thinking": thinking, "signature": signature(thinking) })
}

/// A `message`; `ending` is `None` while it streams.
fn message(id: &str, model: &str, content: Vec<Value>, ending: Option<&Ending>, usage: Value) -> Value {
    let (reason, sequence) = ending.map_or((Value::Null, Value::Null), |e| {
        let (r, s) = stop(e);
        (json!(r), s)
    });
    json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage,
    })
}

/// The whole answer as one `message`.
pub async fn whole(answer: Answer, model: &str) -> Result<Response, AnthropicError> {
    let id = answer.id.clone();
    let prompt = answer.prompt_tokens();
    let (pieces, ended) = answer.collect().await?;
    let mut content: Vec<Value> = pieces
        .iter()
        .map(|p| match p {
            Piece::Reasoning(t) => thinking_block(t),
            Piece::Text(t) => json!({ "type": "text", "text": t }),
            Piece::Call(c) => tool_use(c),
        })
        .collect();
    if content.iter().all(|b| b["type"] == "thinking") {
        content.push(json!({ "type": "text", "text": "" }));
    }
    let u = usage(prompt, ended.cached_tokens(), ended.output_tokens());
    Ok(axum::Json(message(&id, model, content, Some(&ended.ending), u)).into_response())
}

/// The answer as Anthropic's event stream.
/// `quiet`: when a silent stream sends a `ping` (`--sse-keepalive`).
pub fn stream(answer: Answer, model: String, quiet: Quiet) -> Response {
    let (tx, resp) = sse::open();
    tokio::spawn(async move {
        // A send fails only when the client is gone; then dropping the
        // answer stops its job.
        let _ = pump(answer, model, &tx, quiet).await;
    });
    resp
}

/// The block a streamed message has open.
#[derive(PartialEq, Eq)]
enum Open {
    None,
    Text,
    /// A thinking block and its text so far (its signature closes it).
    Thinking(String),
}

/// The blocks of a streamed message: which one is open, how many started.
struct Blocks<'a> {
    tx: &'a Events,
    started: usize,
    open: Open,
    /// A text or tool-use block started.
    answered: bool,
}

impl Blocks<'_> {
    async fn send(&self, name: &str, data: Value) -> Result<(), Gone> {
        self.tx.send(Ok(sse::event(name, &data))).await.map_err(|_| Gone)
    }

    async fn delta(&self, delta: Value) -> Result<(), Gone> {
        let index = self.started - 1;
        self.send("content_block_delta", json!({ "type": "content_block_delta", "index": index, "delta": delta })).await
    }

    async fn close(&mut self) -> Result<(), Gone> {
        match std::mem::replace(&mut self.open, Open::None) {
            Open::None => return Ok(()),
            Open::Text => {}
            Open::Thinking(t) => self.delta(json!({ "type": "signature_delta", "signature": signature(&t) })).await?,
        }
        self.send("content_block_stop", json!({ "type": "content_block_stop", "index": self.started - 1 })).await
    }

    async fn piece(&mut self, p: Piece) -> Result<(), Gone> {
        match p {
            Piece::Reasoning(t) => {
                if !matches!(self.open, Open::Thinking(_)) {
                    self.close().await?;
                    self.start(json!({ "type": "thinking", "thinking": "", "signature": "" })).await?;
                    self.open = Open::Thinking(String::new());
                }
                if let Open::Thinking(all) = &mut self.open {
                    all.push_str(&t);
                }
                self.delta(json!({ "type": "thinking_delta", "thinking": t })).await
            }
            Piece::Text(t) => {
                if self.open != Open::Text {
                    self.close().await?;
                    self.start(json!({ "type": "text", "text": "" })).await?;
                    self.open = Open::Text;
                }
                self.delta(json!({ "type": "text_delta", "text": t })).await
            }
            Piece::Call(c) => {
                self.close().await?;
                let mut head = tool_use(&c);
                head["input"] = json!({});
                self.start(head).await?;
                let index = self.started - 1;
                let delta = json!({ "type": "input_json_delta", "partial_json": c.arguments });
                self.send(
                    "content_block_delta",
                    json!({ "type": "content_block_delta", "index": index, "delta": delta }),
                )
                .await?;
                self.send("content_block_stop", json!({ "type": "content_block_stop", "index": index })).await
            }
        }
    }

    async fn start(&mut self, block: Value) -> Result<(), Gone> {
        let index = self.started;
        self.started += 1;
        self.answered |= block["type"] != "thinking";
        self.send(
            "content_block_start",
            json!({ "type": "content_block_start", "index": index, "content_block": block }),
        )
        .await
    }
}

/// The client went away.
struct Gone;

async fn pump(mut answer: Answer, model: String, tx: &Events, mut quiet: Quiet) -> Result<(), Gone> {
    let prompt = answer.prompt_tokens();
    let mut blocks = Blocks { tx, started: 0, open: Open::None, answered: false };
    // The cached part of the input is known when the answer ends (its
    // `message_delta` says it); until then all of it counts as input.
    let head = message(&answer.id, &model, Vec::new(), None, usage(prompt, 0, 0));
    blocks.send("message_start", json!({ "type": "message_start", "message": head })).await?;
    blocks.send("ping", json!({ "type": "ping" })).await?;
    quiet.sent();
    let ended: Ended = loop {
        // Silence (a long prefill, a wait in the queue, text held back for
        // stop sequences or call syntax) is broken by a `ping`, as Anthropic's.
        let step = match quiet.within(answer.next()).await {
            None => {
                blocks.send("ping", json!({ "type": "ping" })).await?;
                continue;
            }
            Some(Err(e)) => {
                let e = AnthropicError(e);
                return blocks.send("error", e.body()).await;
            }
            Some(Ok(step)) => step,
        };
        match step {
            Step::Out(pieces) => {
                if !pieces.is_empty() {
                    quiet.sent();
                }
                for p in pieces {
                    blocks.piece(p).await?;
                }
            }
            Step::Done(pieces, ended) => {
                for p in pieces {
                    blocks.piece(p).await?;
                }
                break *ended;
            }
        }
    };
    if !blocks.answered {
        // A message always has an answer block, as a whole answer does.
        blocks.close().await?;
        blocks.start(json!({ "type": "text", "text": "" })).await?;
        blocks.open = Open::Text;
    }
    blocks.close().await?;
    let (reason, sequence) = stop(&ended.ending);
    let delta = json!({ "stop_reason": reason, "stop_sequence": sequence });
    let u = usage(prompt, ended.cached_tokens(), ended.output_tokens());
    blocks.send("message_delta", json!({ "type": "message_delta", "delta": delta, "usage": u })).await?;
    blocks.send("message_stop", json!({ "type": "message_stop" })).await
}
