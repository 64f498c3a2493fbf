//! One request's decoding in progress, shared by the plain loop and the
//! speculative rounds of the serial executor (either can continue the
//! other: both keep the caches holding `history` minus its last token,
//! which the next step feeds).

use crate::constraint::Constraint;
use crate::engine::Engine;
use crate::error::EngineError;
use crate::job::{Finish, Flow, TokenOut};
use crate::request::GenerateRequest;
use crate::sampling::{top_logprobs, Sampler};
use mlx_rs::Array;
use std::time::Instant;

pub(crate) struct Decoding {
    /// The request, its grammar moved to `constraint`.
    pub req: GenerateRequest,
    /// The grammar the output follows: each step's mask, moved past each
    /// emitted token.
    pub constraint: Option<Constraint>,
    pub sampler: Sampler,
    pub eos: Vec<u32>,
    /// Prompt plus every emitted token.
    pub history: Vec<u32>,
    pub out: Vec<u32>,
    pub first_at: Option<Instant>,
}

impl Decoding {
    pub fn new(engine: &Engine, mut req: GenerateRequest) -> Result<Self, EngineError> {
        let eos = if req.stop_on_eos { engine.eos_ids() } else { Vec::new() };
        Ok(Decoding {
            constraint: req.constraint.take(),
            sampler: Sampler::new(req.params.clone())?,
            eos,
            history: req.prompt.clone(),
            req,
            out: Vec::new(),
            first_at: None,
        })
    }

    /// Tokens this request may still emit.
    pub fn room(&self) -> usize {
        self.req.max_tokens.saturating_sub(self.out.len())
    }

    /// Emits token `id`, drawn from the `[1, V]` logprobs `lp`, by the
    /// serial loop's rules: EOS ends without emitting; the caller may stop;
    /// `max_tokens` ends with `length`; a grammar that is complete ends
    /// with `stop`. Some: the request is over.
    pub fn emit(
        &mut self,
        id: u32,
        lp: &Array,
        on_token: &mut impl FnMut(&TokenOut) -> Flow,
    ) -> Result<Option<Finish>, EngineError> {
        self.first_at.get_or_insert_with(Instant::now);
        if self.eos.contains(&id) {
            return Ok(Some(Finish::Stop));
        }
        let (logprob, top) = match self.req.logprobs {
            Some(k) => (Some(logprob_of(lp, id)?), top_logprobs(lp, k)?),
            None => (None, Vec::new()),
        };
        if let Some(c) = self.constraint.as_mut() {
            c.accept(id)?;
        }
        self.out.push(id);
        self.history.push(id);
        if on_token(&TokenOut { id, logprob, top }) == Flow::Stop {
            return Ok(Some(Finish::Stop));
        }
        if self.out.len() >= self.req.max_tokens {
            return Ok(Some(Finish::Length));
        }
        Ok(self.constraint.as_ref().is_some_and(Constraint::is_done).then_some(Finish::Stop))
    }
}

/// `lp[0, id]` as f32.
pub(crate) fn logprob_of(lp: &Array, id: u32) -> Result<f32, EngineError> {
    use mlx_rs::ops::indexing::IndexOp;
    Ok(lp.index((0, id as i32)).as_dtype(mlx_rs::Dtype::Float32)?.try_item_cast::<f32>()?)
}
