//! One decode step over every row: input `[B, 1]` (each row's pending
//! token), per-row logits processors, logprobs and sampler (own seed and
//! key), then per-row stop checks. When some row drafted, the step is a
//! speculative round instead (`spec_round`).
//!
//! Steps are pipelined where every row allows it (no penalties, grammar or
//! drafter: nothing that needs the last token on the host before the next
//! step is built): step t+1 is built from step t's tokens, still on the
//! device, and queued before step t's tokens are read, so the host builds
//! graphs while the device computes (not while requests are joining). The
//! queued step is kept in `ahead`; whatever changes the batch's rows from
//! outside a step (a joiner merging, a speculative round) first reads it
//! (`settle`).

use super::ahead::Ahead;
use super::emit::{handle_token, Outcome};
use super::state::Scheduler;
use crate::error::EngineError;
use crate::sampling::Sampler;
use crate::tensors::token_array;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::Array;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// Batched decode steps between clearings of MLX's buffer cache (as
/// mlx-lm's batch generator).
const CLEAR_CACHE_EVERY: u32 = 512;

impl Scheduler<'_> {
    /// One decode step over every row.
    pub(super) fn step(&mut self) -> Result<(), EngineError> {
        let started = Instant::now();
        self.steps_since_clear += 1;
        if self.steps_since_clear >= CLEAR_CACHE_EVERY {
            // As mlx-lm's batch generator: freed buffers go back every 512 steps.
            crate::runtime::clear_cache();
            self.steps_since_clear = 0;
        } else {
            self.heap.tick();
        }
        if self.ahead.is_none() {
            if let Some(drafts) = self.draft_rows() {
                return self.spec_step(drafts, started);
            }
        }
        let current = match self.ahead.take() {
            Some(a) => a,
            None => {
                let ids: Vec<u32> = self.rows.iter().map(|r| r.pending).collect();
                self.launch(token_array(&ids).reshape(&[ids.len() as i32, 1])?)?
            }
        };
        let next = if self.pipelinable() {
            self.stats.pipelined_steps.fetch_add(1, Ordering::Relaxed);
            Some(self.launch(current.y.as_dtype(mlx_rs::Dtype::Int32)?.reshape(&[-1, 1])?)?)
        } else {
            None
        };
        self.read(current, next, started)
    }

    /// Reads the queued step, if any, so that every row's pending token is
    /// outside the batch caches again (before rows join or a round drafts).
    pub(super) fn settle(&mut self) -> Result<(), EngineError> {
        match self.ahead.take() {
            Some(a) => self.read(a, None, Instant::now()),
            None => Ok(()),
        }
    }

    /// Whether the next step may be built before this one's tokens are read.
    /// Not while requests are joining: their prefill waits for the queued
    /// step and their merge reads it, so nothing overlaps, and on an H200
    /// pipelining under such churn measured 13-15% less throughput
    /// (docs/benchmarks.md, "Batched throughput").
    fn pipelinable(&self) -> bool {
        if !self.joining.is_empty() || self.cohort.is_some() {
            return false;
        }
        self.rows.iter().all(|r| r.spec.is_none() && r.constraint.is_none() && !r.sampler.params.has_penalties())
    }

    /// Builds and queues one step whose input is `input` (`[B, 1]`).
    fn launch(&mut self, input: Array) -> Result<Ahead, EngineError> {
        self.stats.decode_steps.fetch_add(1, Ordering::Relaxed);
        self.stats.max_batch_rows.fetch_max(self.rows.len() as u64, Ordering::Relaxed);
        let batch = self.batch.as_mut().expect("rows have batch caches");
        let logits = self.engine.forward(&input, batch, true)?;
        let logits = self.adjusted(logits)?;
        // Rows without penalties share one logprobs computation; when every
        // row is greedy, one argmax picks all tokens (per-row results equal
        // the per-row computation: each reduction runs within its row).
        let plain = self.rows.iter().all(|r| !r.sampler.params.has_penalties());
        let all_lp = if plain { Some(Sampler::logprobs(&logits)?) } else { None };
        let mut lps = Vec::with_capacity(self.rows.len());
        let y = match &all_lp {
            Some(lp) if self.rows.iter().all(|r| r.sampler.params.is_greedy()) => {
                for i in 0..self.rows.len() as i32 {
                    lps.push(lp.index(i..i + 1));
                }
                mlx_rs::ops::indexing::argmax_axis(lp, -1, None)?
            }
            _ => {
                let mut ys = Vec::with_capacity(self.rows.len());
                for (i, r) in self.rows.iter_mut().enumerate() {
                    let lp = match &all_lp {
                        Some(all) => all.index(i as i32..i as i32 + 1),
                        None => {
                            Sampler::logprobs(&r.sampler.penalize(logits.index(i as i32..i as i32 + 1), &r.history)?)?
                        }
                    };
                    ys.push(r.sampler.sample(&lp)?);
                    lps.push(lp);
                }
                mlx_rs::ops::concatenate(&ys, 0)?
            }
        };
        let y = y.as_dtype(mlx_rs::Dtype::Uint32)?;
        mlx_rs::transforms::async_eval([&y])?;
        Ok(Ahead { y, lps })
    }

    /// Reads `current`'s tokens and hands each to its row; finished rows
    /// leave, and `next` (queued after `current`, or None) keeps the rest.
    fn read(&mut self, current: Ahead, next: Option<Ahead>, started: Instant) -> Result<(), EngineError> {
        let built = started.elapsed();
        current.y.eval()?;
        let tokens: Vec<u32> = current.y.as_slice::<u32>().to_vec();
        let waited = started.elapsed() - built;
        self.spec_clock.plain(self.rows.len(), started.elapsed().as_secs_f64());
        let rows = self.rows.len();
        let mut keep: Vec<u32> = Vec::new();
        let mut finished = Vec::new();
        for (i, (r, lp)) in self.rows.iter_mut().zip(current.lps).enumerate() {
            match handle_token(r, tokens[i], &lp, &self.stats, &self.shutdown)? {
                Outcome::Continue => keep.push(i as u32),
                Outcome::Done(f) => finished.push((i, f)),
            }
        }
        self.agree_stops(&mut keep, &mut finished);
        self.checkpoint_rows(&keep);
        let pipelined = next.is_some();
        let leaving = finished.len();
        let keep = self.retire(finished, keep)?;
        self.ahead = match next {
            Some(n) if !keep.is_empty() => Some(n.keep(&keep, rows)?),
            _ => None,
        };
        // Where a step's time goes: building graphs on the host (`build_ms`,
        // this step's and, pipelined, the next one's), waiting for the
        // device (`wait_ms`), handing out tokens and retiring rows (the rest).
        tracing::trace!(
            target: "host_engine::batch",
            rows,
            leaving,
            pipelined,
            build_ms = built.as_secs_f64() * 1e3,
            wait_ms = waited.as_secs_f64() * 1e3,
            ms = started.elapsed().as_secs_f64() * 1e3,
            "batched plain step"
        );
        Ok(())
    }

    /// The logits every row samples from: its logit bias added and, for a
    /// constrained row, the tokens its grammar rules out removed (all rows
    /// in one op each). The grammar masks are computed on the CPU while the
    /// forward runs on the device.
    pub(super) fn adjusted(&mut self, logits: Array) -> Result<Array, EngineError> {
        if !self.rows.iter().any(|r| r.constraint.is_some()) {
            return self.adjust(logits, None);
        }
        mlx_rs::transforms::async_eval([&logits])?;
        let words = (logits.shape()[logits.ndim() - 1] as usize).div_ceil(32);
        let mut allowed = Vec::with_capacity(self.rows.len() * words);
        for r in self.rows.iter_mut() {
            match r.allowed_words() {
                Some(w) => allowed.extend(w),
                None => allowed.extend(std::iter::repeat_n(u32::MAX, words)),
            }
        }
        self.adjust(logits, Some(allowed))
    }

    /// `logits` (`[B, V]`, or `[B, W, V]` in a speculative round) with each
    /// row's logit bias added and `masks` (`ceil(V/32)` bit words per row
    /// and position, None when no row is constrained) applied.
    pub(super) fn adjust(&self, logits: Array, masks: Option<Vec<u32>>) -> Result<Array, EngineError> {
        let shape = logits.shape().to_vec();
        let (b, v) = (shape[0], shape[shape.len() - 1]);
        let mut logits = logits;
        if self.rows.iter().any(|r| !r.sampler.params.logit_bias.is_empty()) {
            let mut dense = vec![0f32; (b * v) as usize];
            for (i, r) in self.rows.iter().enumerate() {
                for &(id, bias) in &r.sampler.params.logit_bias {
                    if id < v as u32 {
                        dense[i * v as usize + id as usize] += bias;
                    }
                }
            }
            let rows_shape: Vec<i32> = if shape.len() == 3 { vec![b, 1, v] } else { vec![b, v] };
            logits = logits.add(Array::from_slice(&dense, &rows_shape).as_dtype(logits.dtype())?)?;
        }
        if let Some(m) = masks {
            logits = Sampler::constrain(&logits, &m)?;
        }
        Ok(logits)
    }
}
