//! One constrained row's grammar state: which tokens may come next, the
//! tokens it accepted, and rollback (a speculative round's rejected drafts).

use super::{GrammarError, MaskClock};
use llguidance::Matcher;
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

    /// The tokens allowed next as bit words (bit `id % 32` of word
    /// `id / 32`, as llguidance keeps them), covering the model's
    /// vocabulary. Every EOS id is allowed exactly where the grammar may
    /// end; once it has ended, only EOS is.
    pub fn allowed_words(&mut self) -> Result<Vec<u32>, GrammarError> {
        let started = Instant::now();
        let vob = self.matcher.compute_mask_or_eos().map_err(|e| failed("compute a mask", e))?;
        let n = self.vocab.div_ceil(32);
        let mut words: Vec<u32> = vob.as_slice().iter().copied().chain(std::iter::repeat(0)).take(n).collect();
        let get = |w: &[u32], t: u32| (t as usize) < self.vocab && w[t as usize / 32] >> (t % 32) & 1 == 1;
        let may_end = self.matcher.is_stopped() || self.eos.iter().any(|&t| get(&words, t));
        for &t in self.eos.iter().filter(|&&t| (t as usize) < self.vocab) {
            let (i, bit) = (t as usize / 32, 1u32 << (t % 32));
            words[i] = if may_end { words[i] | bit } else { words[i] & !bit };
        }
        // Ids past the model's vocabulary (the last word's tail) stay off.
        if !self.vocab.is_multiple_of(32) {
            words[n - 1] &= (1u32 << (self.vocab % 32)) - 1;
        }
        self.clock.record_mask(started.elapsed());
        Ok(words)
    }

    /// `allowed_words` as one flag per id.
    pub fn allowed(&mut self) -> Result<Vec<bool>, GrammarError> {
        let words = self.allowed_words()?;
        Ok((0..self.vocab).map(|id| words[id / 32] >> (id % 32) & 1 == 1).collect())
    }

    /// Moves past `token` (which the last mask allowed). EOS needs no move:
    /// it ends the request.
    pub fn accept(&mut self, token: u32) -> Result<(), GrammarError> {
        if self.eos.contains(&token) {
            return Ok(());
        }
        let started = Instant::now();
        let r = self.matcher.consume_token(token).map_err(|e| failed("accept a token", e));
        self.clock.record_accept(started.elapsed());
        r
    }

    /// The masks a speculative round verifies under, one `allowed_words`
    /// row per position of `[pending, drafts..]`, flattened: row i is what may follow
    /// the first i drafts. `drafts` is cut before the first token the
    /// grammar forbids (or an EOS, which ends the request anyway), so the
    /// round counts it as a mismatch. The matcher ends where it started.
    pub fn draft_masks(&mut self, drafts: &mut Vec<u32>) -> Result<Vec<u32>, GrammarError> {
        let mut rows = Vec::with_capacity((drafts.len() + 1) * self.vocab.div_ceil(32));
        let mut consumed = 0;
        loop {
            let words = self.allowed_words()?;
            let next = drafts.get(consumed).copied();
            let ok = next.is_some_and(|t| {
                (t as usize) < self.vocab
                    && words[t as usize / 32] >> (t % 32) & 1 == 1
                    && !self.eos.contains(&t)
                    && !self.matcher.is_stopped()
            });
            rows.extend(words);
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
