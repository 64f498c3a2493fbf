//! An answer as the Responses API writes it: a `response` object whose
//! `output` holds `reasoning` items (one `reasoning_text` part each, no
//! summary), `message` items (one `output_text` part each) and
//! `function_call` items, whole or as the documented event stream
//! (`response.created`, `response.in_progress`, per item
//! `response.output_item.added` … `response.output_item.done`, then
//! `response.completed` or `response.incomplete`), every event numbered
//! by `sequence_number`.

use super::keep::Keep;
use super::request::Echo;
use crate::answer::{new_id, Answer, Ended, Ending, Step};
use crate::choice::{Call, Piece};
use crate::error::ApiError;
use crate::keepalive::{self, Quiet};
use crate::sse::{self, Events};
use axum::body::Bytes;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

/// What the response object says besides its output.
pub struct Meta {
    pub id: String,
    pub created_at: u64,
    pub model: String,
    pub previous_response_id: Option<String>,
    pub store: bool,
    /// Reasoning items carry their text as `encrypted_content` (`sealed`).
    pub seal_reasoning: bool,
    pub echo: Echo,
}

impl Meta {
    fn response(&self, status: &str, output: &[Value], usage: Value) -> Value {
        let e = &self.echo;
        let incomplete = match status {
            "incomplete" => json!({ "reason": "max_output_tokens" }),
            _ => Value::Null,
        };
        json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": null,
            "incomplete_details": incomplete,
            "instructions": e.instructions,
            "max_output_tokens": e.max_output_tokens,
            "metadata": e.metadata,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": e.parallel_tool_calls,
            "previous_response_id": self.previous_response_id,
            "reasoning": e.reasoning,
            "store": self.store,
            "temperature": e.temperature,
            "text": e.text,
            "tool_choice": e.tool_choice,
            "tools": e.tools,
            "top_p": e.top_p,
            "truncation": e.truncation,
            "usage": usage,
        })
    }
}

/// OpenAI counts cached input inside `input_tokens`.
fn usage(prompt: usize, ended: &Ended) -> Value {
    let output = ended.output_tokens();
    json!({
        "input_tokens": prompt,
        "input_tokens_details": { "cached_tokens": ended.cached_tokens() },
        "output_tokens": output,
        "output_tokens_details": { "reasoning_tokens": ended.reasoning_tokens },
        "total_tokens": prompt + output,
    })
}

fn status(ending: &Ending) -> &'static str {
    match ending {
        Ending::MaxTokens => "incomplete",
        _ => "completed",
    }
}

/// The output items as pieces arrive, and the events each step makes
/// (without their sequence numbers). The whole answer and the stream
/// build their items here alike.
#[derive(Default)]
struct Output {
    /// Seal each reasoning item's text into its `encrypted_content`.
    seal: bool,
    items: Vec<Value>,
    /// The message item being written: its id and its text so far.
    open: Option<(String, String)>,
    /// The reasoning item being written: its id and its text so far.
    thinking: Option<(String, String)>,
}

impl Output {
    fn piece(&mut self, p: &Piece) -> Vec<Value> {
        match p {
            Piece::Reasoning(t) => self.reasoning(t),
            Piece::Text(t) => self.text(t),
            Piece::Call(c) => {
                let mut events = self.close_reasoning("completed");
                events.extend(self.close("completed"));
                events.extend(self.call(c));
                events
            }
        }
    }

    fn reasoning(&mut self, t: &str) -> Vec<Value> {
        let mut events = self.close("completed");
        let index = self.items.len();
        if self.thinking.is_none() {
            let id = new_id("rs");
            let item = json!({ "id": id, "type": "reasoning", "status": "in_progress", "summary": [], "content": [] });
            events.push(json!({ "type": "response.output_item.added", "output_index": index, "item": item }));
            events.push(json!({
                "type": "response.content_part.added", "item_id": id, "output_index": index, "content_index": 0,
                "part": { "type": "reasoning_text", "text": "" },
            }));
            self.thinking = Some((id, String::new()));
        }
        if let Some((id, text)) = self.thinking.as_mut() {
            text.push_str(t);
            events.push(json!({
                "type": "response.reasoning_text.delta", "item_id": id, "output_index": index,
                "content_index": 0, "delta": t,
            }));
        }
        events
    }

    /// Ends the open reasoning item, if any, with `status`.
    fn close_reasoning(&mut self, status: &str) -> Vec<Value> {
        let Some((id, text)) = self.thinking.take() else { return Vec::new() };
        let index = self.items.len();
        let part = json!({ "type": "reasoning_text", "text": text });
        let mut item = json!({ "id": id, "type": "reasoning", "status": status, "summary": [], "content": [part] });
        if self.seal {
            item["encrypted_content"] = json!(super::sealed::seal(&text));
        }
        self.items.push(item.clone());
        vec![
            json!({ "type": "response.reasoning_text.done", "item_id": id, "output_index": index, "content_index": 0, "text": text }),
            json!({ "type": "response.content_part.done", "item_id": id, "output_index": index, "content_index": 0, "part": part }),
            json!({ "type": "response.output_item.done", "output_index": index, "item": item }),
        ]
    }

    fn text(&mut self, t: &str) -> Vec<Value> {
        let mut events = self.close_reasoning("completed");
        events.extend(self.open_message());
        if let Some((id, text)) = self.open.as_mut() {
            text.push_str(t);
            events.push(json!({
                "type": "response.output_text.delta", "item_id": id, "output_index": self.items.len(),
                "content_index": 0, "delta": t, "logprobs": [],
            }));
        }
        events
    }

    /// Starts a message item unless one is open.
    fn open_message(&mut self) -> Vec<Value> {
        if self.open.is_some() {
            return Vec::new();
        }
        let index = self.items.len();
        let id = new_id("msg");
        let item = json!({ "id": id, "type": "message", "status": "in_progress", "role": "assistant", "content": [] });
        let events = vec![
            json!({ "type": "response.output_item.added", "output_index": index, "item": item }),
            json!({
                "type": "response.content_part.added", "item_id": id, "output_index": index, "content_index": 0,
                "part": { "type": "output_text", "text": "", "annotations": [] },
            }),
        ];
        self.open = Some((id, String::new()));
        events
    }

    /// Ends the open message item, if any, with `status`.
    fn close(&mut self, status: &str) -> Vec<Value> {
        let Some((id, text)) = self.open.take() else { return Vec::new() };
        let index = self.items.len();
        let part = json!({ "type": "output_text", "text": text, "annotations": [], "logprobs": [] });
        let item = json!({ "id": id, "type": "message", "status": status, "role": "assistant", "content": [part] });
        self.items.push(item.clone());
        vec![
            json!({ "type": "response.output_text.done", "item_id": id, "output_index": index, "content_index": 0, "text": text, "logprobs": [] }),
            json!({ "type": "response.content_part.done", "item_id": id, "output_index": index, "content_index": 0, "part": part }),
            json!({ "type": "response.output_item.done", "output_index": index, "item": item }),
        ]
    }

    fn call(&mut self, c: &Call) -> Vec<Value> {
        let index = self.items.len();
        let id = new_id("fc");
        let item = |arguments: &str, status: &str| json!({ "id": id, "type": "function_call", "status": status, "call_id": c.id, "name": c.name, "arguments": arguments });
        let done = item(&c.arguments, "completed");
        self.items.push(done.clone());
        vec![
            json!({ "type": "response.output_item.added", "output_index": index, "item": item("", "in_progress") }),
            json!({ "type": "response.function_call_arguments.delta", "item_id": id, "output_index": index, "delta": c.arguments }),
            json!({ "type": "response.function_call_arguments.done", "item_id": id, "output_index": index, "name": c.name, "arguments": c.arguments }),
            json!({ "type": "response.output_item.done", "output_index": index, "item": done }),
        ]
    }

    /// Ends the output: the open reasoning or message item closes as the
    /// response ends; an answer with nothing in it but reasoning is still
    /// one (empty) message.
    fn finish(&mut self, status: &str) -> Vec<Value> {
        let mut events = self.close_reasoning(status);
        if self.items.iter().all(|i| i["type"] == "reasoning") {
            events.extend(self.open_message());
        }
        events.extend(self.close(status));
        events
    }
}

/// The whole answer as one response object.
pub async fn whole(answer: Answer, meta: Meta, keep: Keep) -> Result<Response, ApiError> {
    let prompt = answer.prompt_tokens();
    let (pieces, ended) = answer.collect().await?;
    let mut out = Output { seal: meta.seal_reasoning, ..Default::default() };
    for p in &pieces {
        out.piece(p);
    }
    let status = status(&ended.ending);
    out.finish(status);
    let body = meta.response(status, &out.items, usage(prompt, &ended));
    keep.keep(&meta.id, &body, &out.items);
    Ok(axum::Json(body).into_response())
}

/// The answer as the Responses event stream.
/// `quiet`: when a silent stream sends an SSE comment (`--sse-keepalive`).
pub fn stream(answer: Answer, meta: Meta, keep: Keep, quiet: Quiet) -> Response {
    let (tx, resp) = sse::open();
    tokio::spawn(async move {
        // A send fails only when the client is gone; then dropping the
        // answer stops its job.
        let _ = pump(answer, meta, keep, Numbered { tx: &tx, next: 0, quiet }).await;
    });
    resp
}

/// Sends events numbered in order, and keep-alive comments between them.
struct Numbered<'a> {
    tx: &'a Events,
    next: u64,
    quiet: Quiet,
}

/// The client went away.
struct Gone;

impl Numbered<'_> {
    async fn send(&mut self, mut event: Value) -> Result<(), Gone> {
        event["sequence_number"] = json!(self.next);
        self.next += 1;
        let name = event["type"].as_str().unwrap_or("message").to_owned();
        self.quiet.sent();
        self.tx.send(Ok(sse::event(&name, &event))).await.map_err(|_| Gone)
    }

    /// The answer's next step; while the stream stays silent (a long
    /// prefill, a wait in the queue, call syntax held back), a comment
    /// goes out every keep-alive interval.
    async fn next(&mut self, answer: &mut Answer) -> Result<Result<Step, ApiError>, Gone> {
        loop {
            match self.quiet.within(answer.next()).await {
                Some(step) => return Ok(step),
                None => self.tx.send(Ok(Bytes::from_static(keepalive::COMMENT))).await.map_err(|_| Gone)?,
            }
        }
    }

    async fn all(&mut self, events: Vec<Value>) -> Result<(), Gone> {
        for e in events {
            self.send(e).await?;
        }
        Ok(())
    }
}

async fn pump(mut answer: Answer, meta: Meta, keep: Keep, mut tx: Numbered<'_>) -> Result<(), Gone> {
    let prompt = answer.prompt_tokens();
    let head = meta.response("in_progress", &[], Value::Null);
    tx.send(json!({ "type": "response.created", "response": head })).await?;
    tx.send(json!({ "type": "response.in_progress", "response": head })).await?;
    let mut out = Output { seal: meta.seal_reasoning, ..Default::default() };
    let ended = loop {
        match tx.next(&mut answer).await? {
            Ok(Step::Out(pieces)) => {
                for p in &pieces {
                    let events = out.piece(p);
                    tx.all(events).await?;
                }
            }
            Ok(Step::Done(pieces, ended)) => {
                for p in &pieces {
                    let events = out.piece(p);
                    tx.all(events).await?;
                }
                break *ended;
            }
            Err(e) => {
                tx.send(json!({ "type": "error", "code": "server_error", "message": e.message, "param": null }))
                    .await?;
                let mut failed = meta.response("failed", &out.items, Value::Null);
                failed["error"] = json!({ "code": "server_error", "message": e.message });
                return tx.send(json!({ "type": "response.failed", "response": failed })).await;
            }
        }
    };
    let status = status(&ended.ending);
    let events = out.finish(status);
    tx.all(events).await?;
    let body = meta.response(status, &out.items, usage(prompt, &ended));
    keep.keep(&meta.id, &body, &out.items);
    let kind = if status == "completed" { "response.completed" } else { "response.incomplete" };
    tx.send(json!({ "type": kind, "response": body })).await
}
