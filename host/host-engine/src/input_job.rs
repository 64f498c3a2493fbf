//! Whole-input jobs: a request's inputs run through the model once, on the
//! engine thread, as soon as the engine takes the job (between batch
//! iterations or serial jobs), holding no caches after. Two tasks share the
//! road: embeddings (`embed.rs`) and prompt scoring (`score.rs`). A job
//! travels through the worker's queue like a generation job, so the model
//! only ever runs on the engine thread, and crosses to an isolated engine
//! or to the other ranks as data.

use crate::engine::Engine;
use crate::error::EngineError;
use crate::job::TokenOut;
use crate::stats::Stats;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, Ordering};

/// What a whole-input job computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum InputTask {
    /// One pooled vector per input (the folder's pooling).
    Embed,
    /// Each input token's logprob under the tokens before it, with the
    /// `top` likeliest alternatives (the first token has none).
    Score { top: usize },
}

/// What a job hands back, one entry per input, in input order.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum InputOut {
    Vectors(Vec<Vec<f32>>),
    Scores(Vec<Vec<TokenOut>>),
}

pub type InputResult = Result<InputOut, EngineError>;

pub struct InputJob {
    /// Token ids per input (each non-empty, within the vocabulary).
    pub inputs: Vec<Vec<u32>>,
    pub task: InputTask,
    /// Called once, on the engine thread, with the output or the error.
    pub on_done: Box<dyn FnOnce(InputResult) + Send>,
}

/// Runs `job` now, on the engine thread.
pub(crate) fn run(engine: &Engine, job: InputJob, stats: &Stats, shutdown: &AtomicBool) {
    stats.queued.fetch_sub(1, Ordering::SeqCst);
    let result = if shutdown.load(Ordering::SeqCst) {
        Err(EngineError::InvalidRequest("the server is shutting down".into()))
    } else {
        checked(engine, &job.inputs).and_then(|()| match job.task {
            InputTask::Embed => engine.embed(&job.inputs).map(InputOut::Vectors),
            InputTask::Score { top } => engine.score(&job.inputs, top).map(InputOut::Scores),
        })
    };
    (job.on_done)(result);
}

/// Every input non-empty and within the vocabulary.
fn checked(engine: &Engine, inputs: &[Vec<u32>]) -> Result<(), EngineError> {
    let vocab = engine.model().plan.vocab_size;
    for ids in inputs {
        if ids.is_empty() {
            return Err(EngineError::InvalidRequest("an input is empty".into()));
        }
        if let Some(bad) = ids.iter().find(|&&t| t >= vocab) {
            return Err(EngineError::InvalidRequest(format!(
                "token id {bad} is outside the vocabulary (size {vocab})"
            )));
        }
    }
    Ok(())
}
