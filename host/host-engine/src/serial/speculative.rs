//! The serial speculative executor: one request, rounds of draft → verify
//! → accept → roll back (the module docs of `speculation` say how a round
//! keeps the target's distribution). A round's first input is the previous
//! round's verdict: where the request allows, the next round is queued
//! (`ahead`) before that verdict is read, as if it accepts every draft.

use super::ahead;
use super::decoding::Decoding;
use super::plain;
use super::verify::{queue_verify, Input};
use crate::drafting::Drafting;
use crate::engine::Engine;
use crate::error::{model_err, EngineError};
use crate::job::{Finish, Flow, TokenOut};
use crate::speculation::{
    clock, commit_failed, draft_probability_rows, draft_sampling, emitted, next_depth, SpecStats,
};
use crate::target_states::States;
use crate::tensors::token_array;
use crate::thread_clock;
use mlx_rs::ops::indexing::IndexOp;
use plugin_api::abi_stable::std_types::RSlice;
use plugin_api::{CacheBox, DraftArgs, DrafterBox};
use std::time::Instant;

/// Decodes `d` to its end with speculative rounds, falling back to plain
/// steps when rounds stop paying (unless `drafting.always`).
pub(crate) fn decode(
    engine: &Engine,
    d: &mut Decoding,
    caches: &mut [CacheBox],
    drafting: &Drafting,
    drafter: &mut DrafterBox,
    prompt_states: Option<States>,
    on_token: &mut impl FnMut(&TokenOut) -> Flow,
) -> Result<(Finish, SpecStats), EngineError> {
    let max_depth = drafting.depth;
    let mut stats =
        SpecStats { kind: drafting.kind.clone(), accepted_by_position: vec![0; max_depth], ..Default::default() };
    let wants = drafting.reads_states();
    let prompt = RSlice::from_slice(&d.req.prompt);
    // A drafter that fails costs this request its speculation, not its answer.
    let prefilled = match &prompt_states {
        Some(s) => s.lend(|s| drafter.prefill_states(prompt, s)),
        None => drafter.prefill(prompt),
    };
    if let Err(e) = prefilled.into_result() {
        stats.disabled = Some(format!("the drafter failed to prefill ({e}): plain steps"));
    }
    let mut depth = max_depth.max(1);
    let mut clock = clock::RoundClock::default();
    let judge = !drafting.always;
    let pipelining = wants.is_some() && engine.pipelines_rounds() && ahead::allowed(d);
    let mut queued: Option<ahead::Queued> = None;
    let mut last_verdict = Instant::now();
    // The host's own work per round (CPU time, not waits), for the trace.
    let mut round_cpu = thread_clock::now();
    loop {
        let (mut round, states, starts, marked, since, draft_ms) = match queued.take() {
            Some(q) => {
                stats.pipelined += 1;
                (q.round, q.states, q.starts, true, last_verdict, 0.0)
            }
            None => {
                let room = d.room();
                // Plain steps run in the pipelined plain loop: after a
                // fallback (the request's remaining tokens), for the clock's
                // reference samples, and when no room is left for a draft.
                if stats.disabled.is_some() || room < 2 {
                    let finish = plain::decode(engine, d, caches, usize::MAX, on_token)?.unwrap_or(Finish::Length);
                    return Ok((finish, stats));
                }
                if judge && clock.wants_plain_sample(d.out.len()) {
                    if let Some(f) = plain_sample(engine, d, caches, &mut clock, on_token)? {
                        return Ok((f, stats));
                    }
                    continue;
                }
                let since = Instant::now();
                // The drafter's answer is authoritative; 0 tokens = a plain step.
                let n = depth.min(room - 1);
                let args = DraftArgs {
                    history: RSlice::from_slice(&d.history),
                    max_tokens: n as u32,
                    sampling: draft_sampling(&d.sampler, d.history.len()),
                };
                let (mut drafts, mut q) = match crate::target_kv::draft(drafter, args, &drafting.kv, caches, 0) {
                    Ok(r) => {
                        let tokens: Vec<u32> = r.tokens.into_iter().take(n).collect();
                        let q = draft_probability_rows(r.probabilities, &d.sampler, tokens.len());
                        (tokens, q)
                    }
                    Err(e) => {
                        stats.disabled = Some(format!("the drafter failed ({e}): plain steps from here"));
                        continue;
                    }
                };
                let draft_ms = since.elapsed().as_secs_f64() * 1e3;
                // Drafts the grammar forbids are cut (a mismatch), and every
                // position is verified under the grammar's mask there.
                let masks = match d.constraint.as_mut() {
                    Some(c) => {
                        let masks = c.draft_masks(&mut drafts)?;
                        q = q.filter(|_| !drafts.is_empty()).map(|q| q.index(..drafts.len() as i32));
                        Some(masks)
                    }
                    None => None,
                };
                let starts: Vec<u64> = caches.iter().map(|c| c.offset()).collect();
                if !drafts.is_empty() {
                    // A layout may refuse a round (a wrapped ring cannot roll
                    // back): then plain steps, and it says why.
                    if let Some(e) = caches.iter_mut().find_map(|c| c.spec_begin().into_result().err()) {
                        stats.disabled =
                            Some(format!("a cache layout refused a speculative round ({e}): plain steps from here"));
                        drafts.clear();
                        q = None;
                    }
                }
                let mut input = vec![*d.history.last().expect("a decoding has a prompt")];
                input.extend_from_slice(&drafts);
                let marked = !drafts.is_empty();
                let tokens = token_array(&input);
                let (round, states) = queue_verify(
                    engine,
                    &tokens,
                    Input::Read(input),
                    q.as_ref(),
                    masks,
                    caches,
                    &mut d.sampler,
                    wants,
                )?;
                (round, states, starts, marked, since, draft_ms)
            }
        };
        // The next round goes on the device behind this one, before this
        // verdict is read, as if it accepts every draft.
        let (mut ahead_ms, mut ahead_cpu_ms) = (0.0, 0.0);
        if pipelining && stats.disabled.is_none() {
            let room_after = d.room().saturating_sub(round.width());
            let sampled_next = judge && clock.wants_plain_sample(d.out.len() + round.width());
            if let (Some(s), Some(w), false) = (&states, wants, sampled_next || room_after < 2) {
                // The depth the round after this one gets when it accepts
                // everything (a round of no drafts leaves the depth alone).
                let k = round.width() - 1;
                let next = if k > 0 { next_depth(k, max_depth, drafting.fixed_depth()) } else { depth };
                let n = next.min(room_after - 1);
                let (t, cpu) = (Instant::now(), thread_clock::now());
                match ahead::queue(engine, d, caches, drafter, w, &round, s, n)? {
                    Ok(q) => queued = q,
                    Err(why) => stats.disabled = Some(why),
                }
                ahead_ms = t.elapsed().as_secs_f64() * 1e3;
                ahead_cpu_ms = thread_clock::ms_since(cpu);
            }
        }
        let (waited, read_cpu) = (Instant::now(), thread_clock::now());
        round.read()?;
        let read_ms = waited.elapsed().as_secs_f64() * 1e3;
        // A wait for the device may spin in the CUDA driver: not host work.
        let read_cpu_ms = thread_clock::ms_since(read_cpu);
        let (t, n) = emitted(round.out.as_slice::<u32>(), &round.input[1..], round.rejection);
        let k = round.k;
        if k > 0 {
            stats.rejection_sampling |= round.rejection;
            depth = stats.record_round(k, n, max_depth, judge, drafting.fixed_depth());
        }
        if marked && settle_caches(engine, caches, &starts, &round.input[..n + 1], n == k)? {
            stats.replays += 1;
        }
        if n < k && queued.take().is_some() {
            // Built on drafts this verdict refused: gone with the rollback.
            stats.pipelined_dropped += 1;
        }
        if k > 0 {
            if states.is_none() {
                if let Err(e) = drafter.commit(n as u32).into_result() {
                    stats.disabled = Some(commit_failed(e));
                }
            }
            // Time the round: plain samples are the reference; a request
            // whose rounds emit fewer tokens per second stops speculating.
            clock.round(since.elapsed().as_secs_f64(), k + 1, n + 1);
            if stats.disabled.is_none() && judge {
                stats.disabled = crate::lockstep::agreed(clock.verdict());
            }
        }
        // A drafter reading the target's states hears of every verify, one
        // of no drafts too (its own cache grows with every position); one
        // that drafted ahead adopts or forgets that round here.
        if let Some(s) = &states {
            if let Err(e) = s.lend(|s| drafter.commit_states(n as u32, s)).into_result() {
                stats.disabled = Some(commit_failed(e));
            }
        }
        if stats.disabled.is_some() {
            ahead::drop_queued(engine, caches, &mut queued, &mut stats)?;
        }
        tracing::trace!(
            target: "host_engine::spec",
            width = k + 1,
            accepted = n,
            draft_ms,
            build_ms = (waited - since).as_secs_f64() * 1e3 - draft_ms,
            launch_ms = (waited - round.built).as_secs_f64() * 1e3,
            wait_ms = waited.elapsed().as_secs_f64() * 1e3,
            read_ms,
            ahead_ms,
            ahead_draft_ms = queued.as_ref().map_or(0.0, |q| q.draft_ms),
            ahead_launch_ms = queued.as_ref().map_or(0.0, |q| q.round.launch_ms),
            ahead = queued.is_some(),
            ahead_cpu_ms,
            cpu_ms = thread_clock::ms_since(round_cpu) - read_cpu_ms,
            "speculative round"
        );
        round_cpu = thread_clock::now();
        last_verdict = Instant::now();
        for (i, &id) in t.iter().take(n + 1).enumerate() {
            if let Some(f) = d.emit(id, &round.lps.index(i as i32..i as i32 + 1), on_token)? {
                ahead::drop_queued(engine, caches, &mut queued, &mut stats)?;
                return Ok((f, stats));
            }
        }
    }
}

/// Ends a round in the caches: a full accept commits everything appended;
/// otherwise each layout keeps `kept` (pending + accepted drafts), and
/// snapshot layouts that went back to the round's start get them replayed.
/// Whether a replay ran.
fn settle_caches(
    engine: &Engine,
    caches: &mut [CacheBox],
    starts: &[u64],
    kept: &[u32],
    all_kept: bool,
) -> Result<bool, EngineError> {
    if all_kept {
        for c in caches.iter_mut() {
            c.spec_commit().into_result().map_err(model_err("spec_commit"))?;
        }
        return Ok(false);
    }
    let keep = [kept.len() as u64];
    for c in caches.iter_mut() {
        c.spec_rollback(RSlice::from_slice(&keep)).into_result().map_err(model_err("spec_rollback"))?;
    }
    engine.replay_if_restored(starts, kept, caches)
}

/// A run of plain steps timed from its first token to its last: the steady
/// rate of the pipelined plain loop, which is what falling back gives (a
/// sample's first step has nothing to overlap with; on the H200 it made
/// 3-token samples cost 4.4 ms a token against 2.8 ms in a long run).
fn plain_sample(
    engine: &Engine,
    d: &mut Decoding,
    caches: &mut [CacheBox],
    clock: &mut clock::RoundClock,
    on_token: &mut impl FnMut(&TokenOut) -> Flow,
) -> Result<Option<Finish>, EngineError> {
    let (mut first, mut last) = (None, Instant::now());
    let before = d.out.len();
    let mut timed = |t: &TokenOut| {
        last = Instant::now();
        first.get_or_insert(last);
        on_token(t)
    };
    if let Some(f) = plain::decode(engine, d, caches, clock::PLAIN_SAMPLE_TOKENS, &mut timed)? {
        return Ok(Some(f));
    }
    let intervals = (d.out.len() - before).saturating_sub(1);
    let seconds = first.map_or(0.0, |f: Instant| (last - f).as_secs_f64());
    clock.plain(seconds, intervals);
    tracing::trace!(target: "host_engine::spec", intervals, ms = seconds * 1e3, "plain sample");
    Ok(None)
}
