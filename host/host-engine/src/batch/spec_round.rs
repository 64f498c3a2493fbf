//! Speculative rounds inside continuous batching.
//!
//! Each step, every speculating row asks the drafter (one instance that
//! keeps no per-request state: `caps::HISTORY_ONLY`) for 0..depth tokens.
//! When any row drafted, ONE target forward verifies them all: input
//! `[B, k+1]` where row r is `[pending, its drafts, filler...]` (k = the
//! longest draft; filler columns are causal-after the real ones, so they
//! change no real position's logits). Per row, the target's choice at each
//! position is drawn as in plain decoding; drafts are accepted while they
//! equal it; the first mismatch (or the bonus position) emits the target's
//! token. A sampling row whose drafter returned its probability rows q is
//! verified by rejection sampling instead, as in the serial executor.
//! Drafters with per-request state (two-model) get one instance per row.
//! Drafters that read the target's states (MTP, block drafters) also get
//! one each: the row's prompt states at join (such joiners prefill on their
//! own, `joining`), and after every verify the row's slice of the batch's
//! states (`commit_states`, a verify of 0 drafts included: while such a row
//! speculates, every step is a verify).
//! Rows without drafts ride along and use position 0 only. The caches then
//! keep `1 + accepted` tokens per row (`spec_rollback` with one count per
//! row; a layout leaves holes where rows kept fewer). Over recurrent state
//! (`caps::SPEC_REPLAY`) a layout that kept the states after each position
//! of the verify (`rolls_back_in_place`) keeps each row's count the same
//! way; otherwise the rollback restores every row's round start and one
//! padded forward replays each row's kept tokens (`replay_kept`).

use super::emit::{handle_token, Outcome};
use super::row_spec::RowSpec;
use super::state::Scheduler;
use crate::error::{model_err, EngineError};
use crate::sampling::Sampler;
use crate::speculation::{commit_failed, draft_probability_rows, draft_sampling, emitted};
use crate::tensors::token_array;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::Array;
use plugin_api::abi_stable::std_types::RSlice;
use plugin_api::DraftArgs;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// What one row's round emits (`t[..=n]`) and how many drafts it accepted (`n`).
type Verdict = (Vec<u32>, usize);

/// One row's drafts this step, with the drafter's probability rows q when
/// the row samples and the drafter returned them (then the row is verified
/// by rejection sampling; otherwise by exact match of the target's samples).
pub(super) struct RowDraft {
    tokens: Vec<u32>,
    q: Option<Array>,
    /// A constrained row's masks at `[pending, tokens..]` (`Constraint::draft_masks`).
    masks: Option<Vec<u32>>,
}

impl Scheduler<'_> {
    /// Each row's drafts, or None when no row drafted (a plain step).
    pub(super) fn draft_rows(&mut self) -> Option<Vec<RowDraft>> {
        if !self.rows.iter().any(|r| r.spec.as_ref().is_some_and(RowSpec::active)) {
            return None;
        }
        // The cost rule needs a plain step at this batch size to compare with.
        let drafting = self.engine.drafting()?;
        if !drafting.always && self.spec_clock.wants_plain_sample(self.rows.len()) {
            return None;
        }
        let mut guard = drafting.shared.lock().ok()?;
        let shared = &mut *guard;
        let none = || RowDraft { tokens: Vec::new(), q: None, masks: None };
        let caches: &[plugin_api::CacheBox] = self.batch.as_deref().unwrap_or(&[]);
        let drafts: Vec<RowDraft> = self
            .rows
            .iter_mut()
            .enumerate()
            .map(|(row, r)| {
                let room = r.job.request.max_tokens - r.out.len();
                let Some(s) = r.spec.as_mut().filter(|s| s.active() && room >= 2) else { return none() };
                let n = s.depth.min(room - 1);
                let drafter = match s.own.as_mut() {
                    Some(own) => own,
                    None => &mut *shared,
                };
                let args = DraftArgs {
                    history: RSlice::from_slice(&r.history),
                    max_tokens: n as u32,
                    sampling: draft_sampling(&r.sampler, r.history.len()),
                };
                match crate::target_kv::draft(drafter, args, &drafting.kv, caches, row as u32) {
                    Ok(d) => {
                        let mut tokens: Vec<u32> = d.tokens.into_iter().take(n).collect();
                        let mut q = draft_probability_rows(d.probabilities, &r.sampler, tokens.len());
                        // Drafts the grammar forbids are cut (a mismatch).
                        let masks = match r.constraint.as_mut().map(|c| c.draft_masks(&mut tokens)) {
                            Some(Ok(m)) => Some(m),
                            Some(Err(e)) => {
                                s.stats.disabled = Some(format!("the grammar failed on drafts ({e}): plain steps"));
                                tokens.clear();
                                None
                            }
                            None => None,
                        };
                        q = q.filter(|_| !tokens.is_empty()).map(|q| q.index(..tokens.len() as i32));
                        RowDraft { tokens, q, masks }
                    }
                    // A drafter that fails costs this row its speculation, not its answer.
                    Err(e) => {
                        s.stats.disabled = Some(format!("the drafter failed ({e}): plain steps from here"));
                        none()
                    }
                }
            })
            .collect();
        // A drafter reading the target's states hears of every position: its
        // rows take part in a verify (of 0 drafts too) rather than a plain step.
        let states_wanted = drafting.reads_states().is_some()
            && self.rows.iter().any(|r| r.spec.as_ref().is_some_and(|s| s.active() && s.own.is_some()));
        (states_wanted || drafts.iter().any(|d| !d.tokens.is_empty())).then_some(drafts)
    }

    /// One verify forward over every row's drafts, per-row acceptance and
    /// per-row rollback.
    /// `started`: when this step began (drafting included), for the cost rule.
    pub(super) fn spec_step(&mut self, mut drafts: Vec<RowDraft>, started: Instant) -> Result<(), EngineError> {
        // A constrained row that drafted nothing still samples under its mask.
        for (r, d) in self.rows.iter_mut().zip(drafts.iter_mut()) {
            if d.masks.is_none() {
                d.masks = r.allowed_words();
            }
        }
        let b = self.rows.len();
        let k = drafts.iter().map(|d| d.tokens.len()).max().unwrap_or(0);
        let mut ids = Vec::with_capacity(b * (k + 1));
        for (r, d) in self.rows.iter().zip(drafts.iter().map(|d| &d.tokens)) {
            ids.push(r.pending);
            ids.extend_from_slice(d);
            let filler = *ids.last().unwrap();
            ids.extend(std::iter::repeat_n(filler, k - d.len()));
        }
        self.stats.decode_steps.fetch_add(1, Ordering::Relaxed);
        self.stats.max_batch_rows.fetch_max(b as u64, Ordering::Relaxed);
        let batch = self.batch.as_mut().expect("rows have batch caches");
        for c in batch.iter_mut() {
            c.spec_begin().into_result().map_err(model_err("spec_begin"))?;
        }
        let input = token_array(&ids).reshape(&[b as i32, (k + 1) as i32])?;
        // Each row's pending token's position, before the round moves it.
        let firsts: Vec<u64> = self.rows.iter().map(|r| r.history.len() as u64 - 1).collect();
        let (logits, states) = match self.engine.drafting().and_then(|d| d.reads_states()) {
            Some(wants) => {
                let (l, s) = self.engine.forward_all_states(&input, batch, wants, 0)?;
                (l, Some(s))
            }
            None => (self.engine.forward_all(&input, batch)?, None),
        };
        let v = logits.shape()[logits.ndim() - 1];
        let logits = logits.reshape(&[b as i32, (k + 1) as i32, v])?;
        let logits = self.adjust(logits, round_masks(&drafts, k + 1, (v as usize).div_ceil(32)))?;
        let (verdicts, lps) = self.choose(&logits, &drafts)?;
        // The step's cost in plain steps (the choices above were evaluated).
        let cost = crate::lockstep::agreed(self.spec_clock.spec_cost(b, k + 1, started.elapsed().as_secs_f64()));
        tracing::trace!(
            target: "host_engine::batch",
            rows = b,
            width = k + 1,
            ms = started.elapsed().as_secs_f64() * 1e3,
            cost = ?cost,
            drafted = ?drafts.iter().map(|d| d.tokens.len()).collect::<Vec<_>>(),
            "batched speculative step"
        );
        let judge = !self.engine.drafting().is_some_and(|d| d.always);
        let fixed = self.engine.drafting().is_some_and(|d| d.fixed_depth());

        let mut keep_rows = Vec::new();
        let mut finished = Vec::new();
        let mut keep_counts = Vec::with_capacity(b);
        for (i, (r, d)) in self.rows.iter_mut().zip(drafts.iter().map(|d| &d.tokens)).enumerate() {
            let (t, n) = (&verdicts[i].0, verdicts[i].1);
            if let Some(s) = r.spec.as_mut().filter(|_| !d.is_empty()) {
                s.stats.rejection_sampling |= drafts[i].q.is_some();
                if let Some(own) = s.own.as_mut().filter(|_| states.is_none()) {
                    if let Err(e) = own.commit(n as u32).into_result() {
                        s.stats.disabled = Some(commit_failed(e));
                    }
                }
                s.depth = s.stats.record_round(d.len(), n, s.max_depth, judge, fixed);
                if let Some(c) = cost {
                    s.cost.round(n + 1, c);
                    if judge && s.stats.disabled.is_none() {
                        s.stats.disabled = s.cost.verdict();
                    }
                }
            }
            // Its drafter reads the verified states: every verify, 0 drafts too.
            if let (Some(all), Some(s)) = (&states, r.spec.as_mut().filter(|s| s.active())) {
                if let Some(own) = s.own.as_mut() {
                    let row = all.row(i as i32, d.len() as u64 + 1, firsts[i])?;
                    if let Err(e) = row.lend(|st| own.commit_states(n as u32, st)).into_result() {
                        s.stats.disabled = Some(commit_failed(e));
                    }
                }
            }
            keep_counts.push((n + 1) as u64);
            let mut outcome = Outcome::Continue;
            for (j, &id) in t.iter().take(n + 1).enumerate() {
                outcome = handle_token(r, id, &lps[i].index(j as i32..j as i32 + 1), &self.stats, &self.shutdown)?;
                if !matches!(outcome, Outcome::Continue) {
                    break;
                }
            }
            match outcome {
                Outcome::Continue => keep_rows.push(i as u32),
                Outcome::Done(f) => finished.push((i, f)),
            }
        }
        self.agree_stops(&mut keep_rows, &mut finished);
        tracing::trace!(target: "host_engine::batch", kept = ?keep_counts, "batched speculative step kept");
        let all_kept = keep_counts.iter().all(|&n| n as usize == k + 1);
        let replays = &self.replay_layers;
        let batch = self.batch.as_mut().unwrap();
        if all_kept {
            for c in batch.iter_mut() {
                c.spec_commit().into_result().map_err(model_err("spec_commit"))?;
            }
        } else if batch.iter().zip(replays).all(|(c, &replay)| !replay || c.rolls_back_in_place()) {
            // Trims, and snapshot layouts that kept the round's position
            // states: every layout keeps each row's count by itself.
            for c in batch.iter_mut() {
                c.spec_rollback(RSlice::from_slice(&keep_counts)).into_result().map_err(model_err("spec_rollback"))?;
            }
        } else {
            // Every layer back to the round's start: the replay layouts
            // learn each row's count, the others keep nothing of the round.
            for (c, &replay) in batch.iter_mut().zip(replays) {
                let keep = if replay { keep_counts.as_slice() } else { &[0] };
                c.spec_rollback(RSlice::from_slice(keep)).into_result().map_err(model_err("spec_rollback"))?;
            }
            self.replay_kept(&ids, k + 1, &keep_counts)?;
            for s in self.rows.iter_mut().filter_map(|r| r.spec.as_mut()) {
                s.stats.replays += 1;
            }
        }
        self.retire(finished, keep_rows).map(|_| ())
    }

    /// Snapshot-and-replay rollback for the whole batch (`caps::SPEC_REPLAY`
    /// layouts restored every row's round start, and every other layout
    /// dropped the round): ONE forward of the longest kept count replays
    /// each row's kept tokens (`ids`, the verify input, `width` per row),
    /// shorter rows followed by filler that the replay layouts mask as
    /// padding and the other layouts drop again (a round over the replay,
    /// rolled back to `keep`). The forward stays lazy: the next step's
    /// graph evaluates it.
    fn replay_kept(&mut self, ids: &[u32], width: usize, keep: &[u64]) -> Result<(), EngineError> {
        let most = keep.iter().copied().max().unwrap_or(0) as usize;
        if most == 0 {
            return Ok(());
        }
        let batch = self.batch.as_mut().expect("rows have batch caches");
        let mut replay = Vec::with_capacity(keep.len() * most);
        for (row, &n) in ids.chunks(width).zip(keep) {
            replay.extend_from_slice(&row[..n as usize]);
            // Any token serves as filler: it is padding to the replay layouts.
            replay.extend(std::iter::repeat_n(row[0], most - n as usize));
        }
        for c in batch.iter_mut() {
            c.spec_begin().into_result().map_err(model_err("spec_begin"))?;
        }
        let input = token_array(&replay).reshape(&[keep.len() as i32, most as i32])?;
        self.engine.forward(&input, batch, false)?;
        for c in batch.iter_mut() {
            c.spec_rollback(RSlice::from_slice(keep)).into_result().map_err(model_err("spec_rollback"))?;
        }
        self.stats.spec_replays.fetch_add(1, Ordering::Relaxed);
        if keep.iter().any(|&n| n as usize != most) {
            self.stats.spec_replays_padded.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Per row, the tokens to emit and how many drafts were accepted, and
    /// the logprobs the row's tokens were drawn from `[k+1, V]`. A row with
    /// q rows is verified by rejection sampling (`speculation::rejection`),
    /// any other by the target's own choice at each position (argmax or a
    /// sample) compared with its drafts. All rows' verdicts are evaluated
    /// together (one device sync).
    fn choose(&mut self, logits: &Array, drafts: &[RowDraft]) -> Result<(Vec<Verdict>, Vec<Array>), EngineError> {
        let mut lps = Vec::with_capacity(self.rows.len());
        let mut picks = Vec::with_capacity(self.rows.len());
        for (i, (r, d)) in self.rows.iter_mut().zip(drafts).enumerate() {
            let row = logits.index(i as i32);
            let lp = if r.sampler.params.has_penalties() {
                // Only plain rows have penalties: position 0 is all they use.
                Sampler::logprobs(&r.sampler.penalize(row.index(0..1), &r.history)?)?
            } else {
                Sampler::logprobs(&row)?
            };
            let used = d.tokens.len() as i32 + 1;
            let pick = if let Some(q) = &d.q {
                // [2k+1]: accept flags, then the token each position would emit.
                crate::speculation::rejection::verdict(
                    &r.sampler.probabilities(&lp.index(0..used))?,
                    q,
                    &d.tokens,
                    &mut r.sampler,
                )?
            } else if r.sampler.params.is_greedy() {
                mlx_rs::ops::indexing::argmax_axis(lp.index(0..used), -1, None)?
            } else {
                let draws = (0..used).map(|j| r.sampler.sample(&lp.index(j..j + 1))).collect::<Result<Vec<_>, _>>()?;
                mlx_rs::ops::concatenate(&draws, 0)?
            };
            picks.push(pick.as_dtype(mlx_rs::Dtype::Uint32)?);
            lps.push(lp);
        }
        let all = mlx_rs::ops::concatenate(&picks, 0)?;
        all.eval()?;
        let flat: Vec<u32> = all.as_slice::<u32>().to_vec();
        let mut out = Vec::with_capacity(drafts.len());
        let mut at = 0;
        for d in drafts {
            let k = d.tokens.len();
            let len = if d.q.is_some() { 2 * k + 1 } else { k + 1 };
            out.push(emitted(&flat[at..at + len], &d.tokens, d.q.is_some()));
            at += len;
        }
        Ok((out, lps))
    }
}

/// Every row's grammar masks for a round `width` positions wide, `words`
/// bit words each: a constrained row's own masks, then all-allowed rows for
/// its filler; an unconstrained row all allowed. None when no row is
/// constrained.
fn round_masks(drafts: &[RowDraft], width: usize, words: usize) -> Option<Vec<u32>> {
    if drafts.iter().all(|d| d.masks.is_none()) {
        return None;
    }
    let mut all = Vec::with_capacity(drafts.len() * width * words);
    for d in drafts {
        let own = match &d.masks {
            Some(m) => m.as_slice(),
            None => &[],
        };
        all.extend_from_slice(own);
        all.extend(std::iter::repeat_n(u32::MAX, width * words - own.len()));
    }
    Some(all)
}
