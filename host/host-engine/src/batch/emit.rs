//! A row's tokens leaving the batch: each token by the serial loop's rules,
//! and finished rows answered, offered to the prefix cache, and filtered
//! out of the batch caches.

use super::state::{Row, Scheduler};
use crate::engine::Engine;
use crate::error::EngineError;
use crate::job::{Event, Finish, Flow, GenerateResult, TokenOut};
use crate::sampling::top_logprobs;
use crate::serial::logprob_of;
use crate::stats::Stats;
use mlx_rs::Array;
use plugin_api::abi_stable::std_types::RSlice;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

pub(super) enum Outcome {
    Continue,
    Done(Finish),
}

impl Scheduler<'_> {
    /// Removes finished rows (answering them) and filters the batch caches
    /// down to the rows in `keep`, the rows after the last kept slot moved
    /// into the freed ones (`fill_order`: a layout that keeps rows in slots
    /// then moves only those). Returns the order applied.
    pub(super) fn retire(&mut self, finished: Vec<(usize, Finish)>, keep: Vec<u32>) -> Result<Vec<u32>, EngineError> {
        if finished.is_empty() {
            return Ok(keep);
        }
        for &(i, _) in &finished {
            self.keep_final_state(i);
        }
        let mut old: Vec<Option<Row>> = std::mem::take(&mut self.rows).into_iter().map(Some).collect();
        for (i, f) in finished {
            finish_row(old[i].take().expect("a row finishes once"), f, &self.stats, self.engine);
        }
        let order = fill_order(&keep);
        self.rows = order.iter().map(|&i| old[i as usize].take().expect("a kept row is kept once")).collect();
        if order.is_empty() {
            self.batch = None;
        } else {
            for c in self.batch.as_mut().unwrap().iter_mut() {
                c.filter_rows(RSlice::from_slice(&order))
                    .into_result()
                    .map_err(|e| EngineError::Model(format!("filter_rows: {e}")))?;
            }
        }
        Ok(order)
    }

    /// Checkpoints the rows in `keep` that are due (`--generation-checkpoint`).
    pub(super) fn checkpoint_rows(&mut self, keep: &[u32]) {
        let Some(batch) = self.batch.as_ref() else { return };
        for &i in keep {
            let r = &self.rows[i as usize];
            if !r.job.plan.prompt_cache || !self.engine.checkpoint_due(r.out.len()) {
                continue;
            }
            let states: Option<Vec<_>> = batch.iter().map(|c| c.extract_row(i).into_result().ok()).collect();
            if let Some(states) = states {
                self.engine.checkpoint(&r.history, states, batch.iter().all(|c| c.is_trimmable()));
            }
        }
    }

    /// Offers a finishing row's state to the prefix cache (multi-turn reuse).
    fn keep_final_state(&mut self, i: usize) {
        let r = &self.rows[i];
        if !r.job.plan.prompt_cache || (r.stopped_by_caller && !self.keeps_final_state_of_stopped()) {
            return;
        }
        let Some(batch) = self.batch.as_ref() else { return };
        let states: Option<Vec<_>> = batch.iter().map(|c| c.extract_row(i as u32).into_result().ok()).collect();
        let Some(states) = states else { return };
        let held = states.first().map(|s| s.offset as usize).unwrap_or(0);
        let r = &self.rows[i];
        // After a pipelined step the caches also hold the token that ended
        // the row (fed to the step queued behind it).
        let known: Vec<u32> = r.history.iter().copied().chain(r.ended_by).collect();
        if held > 0 && held <= known.len() {
            self.engine.prefix().insert(known[..held].to_vec(), states, batch.iter().all(|c| c.is_trimmable()));
        }
    }
}

/// `keep` (ascending row indices) reordered so that kept rows stay in their
/// slots and the kept rows past the new row count fill the freed slots
/// below it, in order: `[0, 1, 3, 4]` of 5 rows becomes `[0, 1, 4, 3]`.
pub(super) fn fill_order(keep: &[u32]) -> Vec<u32> {
    let n = keep.len() as u32;
    let mut tail = keep.iter().copied().filter(|&r| r >= n);
    let mut order: Vec<u32> = (0..n).map(|i| if keep.contains(&i) { i } else { u32::MAX }).collect();
    for slot in order.iter_mut().filter(|s| **s == u32::MAX) {
        *slot = tail.next().expect("as many kept rows past n as free slots below it");
    }
    order
}

/// The serial loop's per-token rules: EOS ends without emitting; the caller
/// may stop; `max_tokens` ends with `length`.
pub(super) fn handle_token(
    r: &mut Row,
    id: u32,
    lp: &Array,
    stats: &Stats,
    shutdown: &AtomicBool,
) -> Result<Outcome, EngineError> {
    r.first_at.get_or_insert_with(Instant::now);
    // A grammar that failed (its mask, or now this token, which its mask
    // allowed: a parser limit) ends its row with that error, the token
    // unsent; the rows beside it go on.
    if r.grammar_failed.is_none() {
        if let Some(Err(e)) = r.constraint.as_mut().map(|c| c.accept(id)) {
            r.grammar_failed = Some(e);
        }
    }
    if let Some(e) = &r.grammar_failed {
        tracing::warn!(error = %e, "a constrained row's grammar failed: the row ends with an error");
        return Ok(Outcome::Done(Finish::Stop));
    }
    if r.eos.contains(&id) {
        r.ended_by = Some(id);
        return Ok(Outcome::Done(Finish::Stop));
    }
    let (logprob, top) = match r.job.request.logprobs {
        Some(k) => (Some(logprob_of(lp, id)?), top_logprobs(lp, k)?),
        None => (None, Vec::new()),
    };
    r.out.push(id);
    r.history.push(id);
    r.pending = id;
    stats.generated_tokens.fetch_add(1, Ordering::SeqCst);
    let flow = (r.job.on_event)(Event::Token(TokenOut { id, logprob, top }));
    if flow == Flow::Stop || shutdown.load(Ordering::SeqCst) {
        r.stopped_by_caller = true;
        return Ok(Outcome::Done(Finish::Stop));
    }
    if r.out.len() >= r.job.request.max_tokens {
        return Ok(Outcome::Done(Finish::Length));
    }
    // A complete grammar allows nothing more: the answer is whole.
    if r.constraint.as_ref().is_some_and(|c| c.is_done()) {
        return Ok(Outcome::Done(Finish::Stop));
    }
    Ok(Outcome::Continue)
}

fn finish_row(mut r: Row, finish: Finish, stats: &Stats, engine: &Engine) {
    stats.active.fetch_sub(1, Ordering::SeqCst);
    if let Some(e) = r.grammar_failed.take() {
        stats.failed.fetch_add(1, Ordering::SeqCst);
        let _ = (r.job.on_event)(Event::Failed(EngineError::Grammar(e)));
        return;
    }
    if r.stopped_by_caller {
        stats.cancelled.fetch_add(1, Ordering::SeqCst);
        stats.last_cancelled_tokens.store(r.out.len() as u64, Ordering::SeqCst);
    } else {
        stats.completed.fetch_add(1, Ordering::SeqCst);
    }
    let first = r.first_at.unwrap_or_else(Instant::now);
    let result = GenerateResult {
        prompt_tokens: r.job.request.prompt.len(),
        cached_tokens: r.cached,
        prefill_s: (first - r.start).as_secs_f64(),
        decode_s: first.elapsed().as_secs_f64(),
        tokens: std::mem::take(&mut r.out),
        finish,
        speculation: r.spec.take().map(|s| s.stats),
    };
    stats.record(&result, engine);
    let _ = (r.job.on_event)(Event::Done(result));
}

#[cfg(test)]
mod tests {
    use super::fill_order;

    #[test]
    fn kept_rows_past_the_new_count_fill_the_freed_slots() {
        assert_eq!(fill_order(&[0, 1, 3, 4]), vec![0, 1, 4, 3]);
        assert_eq!(fill_order(&[2, 5, 6]), vec![5, 6, 2]);
        assert_eq!(fill_order(&[0, 1, 2]), vec![0, 1, 2]);
        assert_eq!(fill_order(&[]), Vec::<u32>::new());
    }
}
