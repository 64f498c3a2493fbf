//! The serial speculative executor: one request, rounds of draft → verify
//! → accept → roll back (the module docs of `speculation` say how a round
//! keeps the target's distribution). A round waits for the previous one:
//! its first input is the previous round's verdict.

use super::decoding::Decoding;
use super::plain;
use crate::drafting::Drafting;
use crate::engine::Engine;
use crate::error::{model_err, EngineError};
use crate::job::{Finish, Flow, TokenOut};
use crate::sampling::Sampler;
use crate::speculation::{clock, commit_failed, draft_probability_rows, draft_sampling, emitted, rejection, SpecStats};
use crate::target_states::States;
use crate::tensors::token_array;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::Array;
use plugin_api::abi_stable::std_types::RSlice;
use plugin_api::{CacheBox, DraftArgs, DrafterBox, TargetWants};
use std::time::Instant;

/// A verify queued on the device.
struct Round {
    /// int32 `[1, k+1]`: pending, then the drafts.
    input: Vec<u32>,
    k: usize,
    /// Logprobs `[k+1, V]` at every position.
    lps: Array,
    /// uint32: the target's choice at each position `[k+1]` (exact match),
    /// or the rejection-sampling verdict `[2k+1]`.
    out: Array,
    rejection: bool,
    /// When the graph was built, before MLX was handed it (`async_eval`).
    built: Instant,
}

/// Queues one verify of `input` (pending + drafts) and its verdict, under
/// the grammar's masks (`[k+1, ceil(V/32)]` bit words) when the request has one.
/// With `wants`, the verify also keeps those target states for the drafter.
fn queue_round(
    engine: &Engine,
    input: Vec<u32>,
    q: Option<&Array>,
    masks: Option<Vec<u32>>,
    caches: &mut [CacheBox],
    sampler: &mut Sampler,
    wants: Option<&TargetWants>,
) -> Result<(Round, Option<States>), EngineError> {
    let k = input.len() - 1;
    let tokens = token_array(&input);
    let (logits, states) = match wants {
        Some(w) => {
            let first = caches.first().map_or(0, |c| c.offset());
            let (l, s) = engine.forward_all_states(&tokens, caches, w, first)?;
            (l, Some(s))
        }
        None => (engine.forward_all(&tokens, caches)?, None),
    };
    let mut logits = sampler.bias(logits)?;
    if let Some(mut m) = masks {
        // (Rows past k+1 belong to drafts a layout's refusal dropped.)
        let words = (logits.shape()[logits.ndim() - 1] as usize).div_ceil(32);
        m.truncate((k + 1) * words);
        logits = Sampler::constrain(&logits, &m)?;
    }
    // One logprobs op over all rows (reductions stay within a row), then
    // rejection sampling against q, or the target's own choice at every
    // position (one argmax when greedy, one draw per position otherwise).
    let lps = Sampler::logprobs(&logits)?;
    let (out, rejection) = match q {
        Some(q) => (rejection::verdict(&sampler.probabilities(&lps)?, q, &input[1..], sampler)?, true),
        None if sampler.params.is_greedy() => {
            (mlx_rs::ops::indexing::argmax_axis(&lps, -1, None)?.as_dtype(mlx_rs::Dtype::Uint32)?, false)
        }
        None => {
            let draws = (0..=k as i32).map(|i| sampler.sample(&lps.index(i..i + 1))).collect::<Result<Vec<_>, _>>()?;
            (mlx_rs::ops::concatenate(&draws, 0)?.as_dtype(mlx_rs::Dtype::Uint32)?, false)
        }
    };
    let built = Instant::now();
    mlx_rs::transforms::async_eval([&out])?;
    Ok((Round { input, k, lps, out, rejection, built }, states))
}

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
    loop {
        let room = d.room();
        // Plain steps run in the pipelined plain loop: after a fallback
        // (the request's remaining tokens), for the clock's reference
        // samples, and when no room is left for a draft.
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
        let (round, states) = queue_round(engine, input, q.as_ref(), masks, caches, &mut d.sampler, wants)?;
        let waited = Instant::now();
        round.out.eval()?;
        let (t, n) = emitted(round.out.as_slice::<u32>(), &round.input[1..], round.rejection);
        let k = round.k;
        if k > 0 {
            stats.rejection_sampling |= round.rejection;
            depth = stats.record_round(k, n, max_depth, judge, drafting.fixed_depth());
            if settle_caches(engine, caches, &starts, &round.input[..n + 1], n == k)? {
                stats.replays += 1;
            }
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
        // of no drafts too (its own cache grows with every position).
        if let Some(s) = &states {
            if let Err(e) = s.lend(|s| drafter.commit_states(n as u32, s)).into_result() {
                stats.disabled = Some(commit_failed(e));
            }
        }
        tracing::trace!(
            target: "host_engine::spec",
            width = k + 1,
            accepted = n,
            draft_ms,
            build_ms = (waited - since).as_secs_f64() * 1e3 - draft_ms,
            launch_ms = (waited - round.built).as_secs_f64() * 1e3,
            wait_ms = waited.elapsed().as_secs_f64() * 1e3,
            "speculative round"
        );
        for (i, &id) in t.iter().take(n + 1).enumerate() {
            if let Some(f) = d.emit(id, &round.lps.index(i as i32..i as i32 + 1), on_token)? {
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
