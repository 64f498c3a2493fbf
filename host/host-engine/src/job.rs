//! A request as the engine runs it, and what it reports back.
//!
//! A [`Job`] carries the request, the execution plan resolved for it once
//! (`Engine::plan`; the serial and batched executors only read it), and a
//! callback that hears every [`Event`]: tokens, then exactly one `Done` or
//! `Failed`. Returning [`Flow::Stop`] from the callback cancels the job
//! within one step.

use crate::error::EngineError;
use crate::plan::ResolvedExecution;
use crate::request::GenerateRequest;
use crate::speculation::SpecStats;

/// One generated token as the caller sees it.
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone)]
pub struct TokenOut {
    pub id: u32,
    pub logprob: Option<f32>,
    pub top: Vec<(u32, f32)>,
}

/// The caller's answer after each token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Continue,
    /// Stop now (a stop string matched, or the client went away).
    Stop,
}

#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// An EOS token (not emitted) or the caller stopped.
    Stop,
    /// `max_tokens` reached.
    Length,
}

#[derive(serde::Serialize, serde::Deserialize, Debug, Clone)]
pub struct GenerateResult {
    pub tokens: Vec<u32>,
    pub finish: Finish,
    pub prompt_tokens: usize,
    /// Prompt tokens whose state came from the prefix cache.
    pub cached_tokens: usize,
    /// Seconds from start to the first token (prefill + first step).
    pub prefill_s: f64,
    /// Seconds from the first token to the last.
    pub decode_s: f64,
    /// What speculative decoding did, when it ran.
    pub speculation: Option<SpecStats>,
}

impl GenerateResult {
    pub fn prefill_tps(&self) -> f64 {
        self.prompt_tokens as f64 / self.prefill_s.max(1e-9)
    }
    pub fn decode_tps(&self) -> f64 {
        if self.tokens.len() < 2 {
            return 0.0;
        }
        (self.tokens.len() - 1) as f64 / self.decode_s.max(1e-9)
    }
}

/// What a job reports, in order: tokens, then exactly one `Done` or `Failed`.
pub enum Event {
    Token(TokenOut),
    Done(GenerateResult),
    Failed(EngineError),
}

pub struct Job {
    pub request: GenerateRequest,
    /// How it runs, resolved once before it was queued.
    pub plan: ResolvedExecution,
    /// Called for every event; returning `Flow::Stop` cancels the job.
    pub on_event: Box<dyn FnMut(Event) -> Flow + Send>,
}
