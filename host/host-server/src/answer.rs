//! One answer as its job runs, for the APIs that generate one choice per
//! request (Anthropic Messages, OpenAI Responses): reasoning, text and tool
//! calls as they can be released, then how it ended. Each API writes these as its
//! own blocks or items, whole or streamed.
//!
//! Whitespace the model writes around tool calls is the call syntax's
//! layout, not an answer: it is held until text that is not whitespace
//! follows and dropped when a call does, so a forced call gives no empty
//! text block, and whole and streamed answers have the same blocks.

use crate::choice::{Call, ChoiceOut, Piece};
use crate::error::ApiError;
use crate::gen::Running;
use crate::respond::log_done;
use crate::state::{AppState, ServerStats};
use host_engine::{Event, Finish, GenerateResult};
use std::sync::atomic::Ordering;

/// Why an answer ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// A stop string matched (it is not part of the text).
    StopSequence(String),
    /// The model ended its turn after calling tools.
    ToolCalls,
    /// The model ended its turn (EOS, or a grammar that is complete).
    EndOfTurn,
    /// The token limit cut it.
    MaxTokens,
}

impl Ending {
    /// How the log line names it.
    fn name(&self) -> &'static str {
        match self {
            Ending::StopSequence(_) => "stop_sequence",
            Ending::ToolCalls => "tool_calls",
            Ending::EndOfTurn => "end_of_turn",
            Ending::MaxTokens => "max_tokens",
        }
    }
}

pub struct Ended {
    pub ending: Ending,
    pub result: GenerateResult,
    /// Tokens written inside the reasoning block.
    pub reasoning_tokens: usize,
}

impl Ended {
    /// Prompt tokens served from the prefix cache.
    pub fn cached_tokens(&self) -> usize {
        self.result.cached_tokens
    }

    pub fn output_tokens(&self) -> usize {
        self.result.tokens.len()
    }
}

/// What the job gave since the last call.
pub enum Step {
    Out(Vec<Piece>),
    /// The last pieces, and how the answer ended (boxed: it carries the
    /// whole result, the other variant only pieces).
    Done(Vec<Piece>, Box<Ended>),
}

pub struct Answer {
    pub id: String,
    st: AppState,
    run: Running,
    out: ChoiceOut,
    first_ms: Option<u128>,
    /// Whitespace not yet released (see the module's note).
    held_space: String,
}

impl Answer {
    pub fn new(st: AppState, id: String, run: Running, out: ChoiceOut) -> Self {
        Self { id, st, run, out, first_ms: None, held_space: String::new() }
    }

    pub fn prompt_tokens(&self) -> usize {
        self.run.prompt_tokens
    }

    /// Waits for the job's next event. Cancel-safe: the only await is the
    /// channel's receive, so a caller may race it against a timer.
    pub async fn next(&mut self) -> Result<Step, ApiError> {
        match self.run.events.recv().await {
            Some(Event::Token(t)) => {
                self.first_ms.get_or_insert_with(|| self.run.started.elapsed().as_millis());
                let pieces = self.out.push(&t);
                if self.out.stopped() && !self.run.stop.swap(true, Ordering::SeqCst) {
                    ServerStats::bump(&self.st.stats.stop_string_hits);
                }
                Ok(Step::Out(self.settle(pieces, false)))
            }
            Some(Event::Done(result)) => {
                let last = self.out.finish();
                let pieces = self.settle(last, true);
                let ending = match (self.out.stop_sequence(), result.finish) {
                    (Some(s), _) => Ending::StopSequence(s.to_owned()),
                    (None, Finish::Stop) if !self.out.calls.is_empty() => Ending::ToolCalls,
                    (None, Finish::Stop) => Ending::EndOfTurn,
                    (None, Finish::Length) => Ending::MaxTokens,
                };
                log_done(&self.id, &self.run, result.tokens.len(), self.first_ms, ending.name());
                Ok(Step::Done(pieces, Box::new(Ended { ending, result, reasoning_tokens: self.out.reasoning_tokens })))
            }
            Some(Event::Failed(e)) => Err(ApiError::generation_failed(&e)),
            None => Err(ApiError::internal("the engine dropped the request")),
        }
    }

    /// Runs the answer to its end: its pieces, adjacent texts joined.
    pub async fn collect(mut self) -> Result<(Vec<Piece>, Ended), ApiError> {
        let mut all: Vec<Piece> = Vec::new();
        loop {
            let (pieces, ended) = match self.next().await? {
                Step::Out(p) => (p, None),
                Step::Done(p, e) => (p, Some(*e)),
            };
            for p in pieces {
                match (all.last_mut(), p) {
                    (Some(Piece::Text(acc)), Piece::Text(s)) => acc.push_str(&s),
                    (Some(Piece::Reasoning(acc)), Piece::Reasoning(s)) => acc.push_str(&s),
                    (_, p) => all.push(p),
                }
            }
            if let Some(e) = ended {
                return Ok((all, e));
            }
        }
    }

    fn settle(&mut self, pieces: Vec<Piece>, last: bool) -> Vec<Piece> {
        let mut out = Vec::with_capacity(pieces.len());
        for p in pieces {
            match p {
                Piece::Reasoning(r) => out.push(Piece::Reasoning(r)),
                Piece::Text(s) => {
                    self.held_space.push_str(&s);
                    if !self.held_space.trim().is_empty() {
                        out.push(Piece::Text(std::mem::take(&mut self.held_space)));
                    }
                }
                Piece::Call(c) => {
                    self.held_space.clear();
                    out.push(Piece::Call(c));
                }
            }
        }
        // An answer of whitespace alone is still an answer.
        if last && !self.held_space.is_empty() && self.out.calls.is_empty() {
            out.push(Piece::Text(std::mem::take(&mut self.held_space)));
        }
        out
    }
}

/// A call's arguments as a JSON value (the parser only releases calls
/// whose arguments are a JSON object).
pub fn arguments_value(c: &Call) -> serde_json::Value {
    serde_json::from_str(&c.arguments).unwrap_or_else(|_| serde_json::json!({}))
}

/// A fresh id for a message, response or item: `prefix` and 24 letters
/// or digits, never repeated within a process.
pub fn new_id(prefix: &str) -> String {
    let call = host_tools::new_call_id();
    format!("{prefix}_{}", call.trim_start_matches("call_"))
}
