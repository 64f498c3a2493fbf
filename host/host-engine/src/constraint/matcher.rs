//! One constrained row's grammar state: which tokens may come next, the
//! tokens it accepted, and rollback (a speculative round's rejected drafts).

use super::{GrammarError, MaskClock};
use llguidance::Matcher;
use mlx_rs::Array;
use std::sync::Arc;
use std::time::Instant;

/// (A clone continues independently from the same point.)
#[derive(Clone)]
pub struct Constraint {
    matcher: Matcher,
    vocab: usize,
    eos: Vec<u32>,
    clock: Arc<MaskClock>,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint").field("vocab", &self.vocab).finish_non_exhaustive()
    }
}

fn failed(what: &str, e: impl std::fmt::Display) -> GrammarError {
    GrammarError(format!("the grammar's matcher failed to {what}: {e}"))
}

impl Constraint {
    pub(crate) fn new(matcher: Matcher, vocab: usize, eos: Vec<u32>, clock: Arc<MaskClock>) -> Self {
        Self { matcher, vocab, eos, clock }
    }

    /// The tokens allowed next, one flag per id of the model's vocabulary.
    /// Every EOS id is allowed exactly where the grammar may end; once it
    /// has ended, only EOS is.
    pub fn allowed(&mut self) -> Result<Vec<bool>, GrammarError> {
        let started = Instant::now();
        let vob = self.matcher.compute_mask_or_eos().map_err(|e| failed("compute a mask", e))?;
        let mut out: Vec<bool> = (0..self.vocab).map(|i| vob.is_allowed(i as u32)).collect();
        let may_end = self.matcher.is_stopped() || self.eos.iter().any(|&t| out.get(t as usize) == Some(&true));
        for &t in &self.eos {
            if let Some(slot) = out.get_mut(t as usize) {
                *slot = may_end;
            }
        }
        self.clock.record(started.elapsed());
        Ok(out)
    }

    /// `allowed` as a boolean `[1, vocab]` array for the sampler.
    pub fn mask(&mut self) -> Result<Array, GrammarError> {
        let allowed = self.allowed()?;
        Ok(Array::from_slice(&allowed, &[1, allowed.len() as i32]))
    }

    /// Moves past `token` (which the last mask allowed). EOS needs no move:
    /// it ends the request.
    pub fn accept(&mut self, token: u32) -> Result<(), GrammarError> {
        if self.eos.contains(&token) {
            return Ok(());
        }
        self.matcher.consume_token(token).map_err(|e| failed("accept a token", e))
    }

    /// Whether `token` may come next (a speculative round checks its drafts).
    pub fn allows(&mut self, token: u32) -> Result<bool, GrammarError> {
        Ok(self.allowed()?.get(token as usize).copied().unwrap_or(false))
    }

    /// The masks a speculative round verifies under, one `allowed` row per
    /// position of `[pending, drafts..]`, flattened: row i is what may follow
    /// the first i drafts. `drafts` is cut before the first token the
    /// grammar forbids (or an EOS, which ends the request anyway), so the
    /// round counts it as a mismatch. The matcher ends where it started.
    pub fn draft_masks(&mut self, drafts: &mut Vec<u32>) -> Result<Vec<bool>, GrammarError> {
        let mut rows = Vec::with_capacity((drafts.len() + 1) * self.vocab);
        let mut consumed = 0;
        loop {
            let allowed = self.allowed()?;
            let next = drafts.get(consumed).copied();
            let ok = next.is_some_and(|t| {
                allowed.get(t as usize) == Some(&true) && !self.eos.contains(&t) && !self.matcher.is_stopped()
            });
            rows.extend(allowed);
            if !ok {
                drafts.truncate(consumed);
                break;
            }
            self.matcher.consume_token(next.expect("checked above")).map_err(|e| failed("accept a draft", e))?;
            consumed += 1;
        }
        self.rollback(consumed)?;
        Ok(rows)
    }

    /// Undoes the last `n` accepted tokens.
    pub fn rollback(&mut self, n: usize) -> Result<(), GrammarError> {
        if n == 0 {
            return Ok(());
        }
        self.matcher.rollback(n).map_err(|e| failed("roll back", e))
    }

    /// The grammar is complete and nothing may follow it but EOS.
    pub fn is_done(&self) -> bool {
        self.matcher.is_stopped()
    }
}
