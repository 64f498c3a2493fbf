//! The serial speculative executor: one request, rounds of draft → verify
//! → accept → roll back, optionally pipelined (a round queued ahead while
//! the previous one runs on the device; module docs of `speculative`).

use super::{clock, draft_probability_rows, draft_sampling, emitted, model_err, rejection, tensor_ref, SpecStats};
use crate::engine::{Engine, EngineError};
use crate::generate::{token_array, Decoding, Finish, Flow, GenerateRequest, GenerateResult, IndexId, TokenOut};
use crate::sampling::{top_logprobs, Sampler};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::Array;
use plugin_api::abi_stable::std_types::RSlice;
use plugin_api::{CacheBox, DraftAheadArgs, DraftArgs, DrafterBox};
use std::time::Instant;

/// Tokens one chain of pipelined rounds may append inside one speculative
/// round of the cache layouts before the host lets it settle: a rollback
/// restores the chain's start and, for snapshot layouts, re-appends what
/// was kept, so a long chain makes a late rejection dear.
const CHAIN_TOKENS: usize = 128;

/// Whether to queue a round ahead. A kept one overlaps the host's drafting
/// and graph building with the device's work; a voided one costs a whole
/// round of launches and device work that the next round waits behind (on
/// the H200 the host's launches dominate a round, docs/benchmarks.md). So
/// rounds are queued ahead only inside a streak: after two rounds in a row
/// were accepted in full, until the first that is not.
struct AheadGate {
    streak: u32,
}

impl AheadGate {
    const OPEN_AFTER: u32 = 2;

    fn new() -> Self {
        Self { streak: 0 }
    }

    fn open(&self) -> bool {
        self.streak >= Self::OPEN_AFTER
    }

    fn record(&mut self, fully_accepted: bool) {
        self.streak = if fully_accepted { self.streak + 1 } else { 0 };
    }
}

/// A verify queued on the device, not read yet.
struct Round {
    /// int32 `[1, k+1]`: pending, then the drafts (lazy when drafted ahead).
    input: Array,
    k: usize,
    /// Logprobs `[k+1, V]` at every position.
    lps: Array,
    /// uint32: the target's choice at each position `[k+1]` (exact match),
    /// or the rejection-sampling verdict `[2k+1]`.
    out: Array,
    rejection: bool,
    /// Where this round's time starts: its draft for a round drafted in
    /// sync, the previous round's verdict for one queued ahead.
    since: Instant,
    /// Host time spent drafting it, building its graph, and in the
    /// `async_eval` that hands the graph to the device (kernel launches).
    draft_s: f64,
    graph_s: f64,
    launch_s: f64,
}

/// A round after its verdict was read.
struct Verdict {
    /// Input values: pending, then the drafts.
    input: Vec<u32>,
    /// Tokens to emit, the target's or the verdict's: `t[..=n]`.
    t: Vec<u32>,
    /// Drafts accepted.
    n: usize,
}

/// Rounds appended inside one speculative round of the cache layouts.
struct Chain {
    /// Each layout's offset when the chain began.
    starts: Vec<u64>,
    /// Tokens of settled rounds that the caches keep (values).
    kept: Vec<u32>,
}

impl Engine {
    /// Queues one verify of `input` (`[1, k+1]`) and its verdict on the device.
    fn queue_round(
        &self,
        input: Array,
        q: Option<&Array>,
        drafts: &[u32],
        caches: &mut [CacheBox],
        sampler: &mut Sampler,
        since: Instant,
        draft_s: f64,
    ) -> Result<Round, EngineError> {
        let k = input.shape()[1] as usize - 1;
        let t0 = Instant::now();
        let logits = self.forward_all(&input, caches)?;
        // One logprobs op over all rows (reductions stay within a row), then
        // rejection sampling against q, or the target's own choice at every
        // position (one argmax when greedy, one draw per position otherwise).
        let lps = Sampler::logprobs(&logits)?;
        let (out, rejection) = match q {
            Some(q) => (rejection::verdict(&sampler.probabilities(&lps)?, q, drafts, sampler)?, true),
            None if sampler.params.is_greedy() => {
                (mlx_rs::ops::indexing::argmax_axis(&lps, -1, None)?.as_dtype(mlx_rs::Dtype::Uint32)?, false)
            }
            None => {
                let draws =
                    (0..=k as i32).map(|i| sampler.sample(&lps.index(i..i + 1))).collect::<Result<Vec<_>, _>>()?;
                (mlx_rs::ops::concatenate(&draws, 0)?.as_dtype(mlx_rs::Dtype::Uint32)?, false)
            }
        };
        let t1 = Instant::now();
        mlx_rs::transforms::async_eval([&out, &input])?;
        let (graph_s, launch_s) = ((t1 - t0).as_secs_f64(), t1.elapsed().as_secs_f64());
        Ok(Round { input, k, lps, out, rejection, since, draft_s, graph_s, launch_s })
    }

    /// Waits for a round and reads its verdict.
    fn settle(round: &Round) -> Result<Verdict, EngineError> {
        mlx_rs::transforms::eval([&round.out, &round.input])?;
        // int32 ids, read as they are: a cast would be one more op to run
        // and wait for on the round's critical path.
        let input: Vec<u32> = round.input.as_slice::<i32>().iter().map(|&t| t as u32).collect();
        let (t, n) = emitted(round.out.as_slice::<u32>(), &input[1..], round.rejection);
        Ok(Verdict { input, t, n })
    }

    /// Drafts the round after `cur` on the assumption that `cur` accepts
    /// everything, and queues its verify. None: the drafter proposed
    /// nothing, cannot draft ahead (then `ahead` turns off), or failed.
    #[allow(clippy::too_many_arguments)]
    fn queue_ahead(
        &self,
        cur: &Round,
        drafter: &mut DrafterBox,
        n: usize,
        caches: &mut [CacheBox],
        d: &mut Decoding,
        ahead: &mut bool,
    ) -> Result<Option<Round>, EngineError> {
        let t0 = Instant::now();
        let pending = cur.out.index(cur.k as i32..cur.k as i32 + 1).as_dtype(mlx_rs::Dtype::Int32)?.reshape(&[1, 1])?;
        let position = d.history.len() + cur.k + 1;
        let args = DraftAheadArgs {
            pending: tensor_ref(&pending),
            max_tokens: n as u32,
            sampling: draft_sampling(&d.sampler, position),
        };
        let drafts = match drafter.draft_ahead(args).into_result() {
            Ok(a) => unsafe { Array::from_ptr(a.tokens.into_raw()) },
            Err(_) => {
                *ahead = false;
                return Ok(None);
            }
        };
        let m = drafts.size().min(n);
        if m == 0 || drafts.ndim() != 1 {
            // Nothing to verify ahead (the ABI: no round is outstanding for
            // 0 tokens); cur is settled alone.
            return Ok(None);
        }
        let drafts = drafts.index(0..m as i32).as_dtype(mlx_rs::Dtype::Int32)?.reshape(&[1, m as i32])?;
        let input = mlx_rs::ops::concatenate(&[pending, drafts], 1)?;
        let draft_s = t0.elapsed().as_secs_f64();
        self.queue_round(input, None, &[], caches, &mut d.sampler, Instant::now(), draft_s).map(Some)
    }

    /// Ends a chain: the caches keep its settled tokens plus `tail` (with
    /// `all_kept`, everything appended: commit) and snapshot layouts get
    /// them replayed.
    fn close_chain(
        &self,
        chain: Chain,
        tail: &[u32],
        all_kept: bool,
        caches: &mut [CacheBox],
    ) -> Result<(), EngineError> {
        let mut kept = chain.kept;
        kept.extend_from_slice(tail);
        if all_kept {
            for c in caches.iter_mut() {
                c.spec_commit().into_result().map_err(model_err("spec_commit"))?;
            }
            return Ok(());
        }
        let keep = [kept.len() as u64];
        for c in caches.iter_mut() {
            c.spec_rollback(RSlice::from_slice(&keep)).into_result().map_err(model_err("spec_rollback"))?;
        }
        self.replay_if_restored(&chain.starts, &kept, caches)?;
        Ok(())
    }

    pub fn generate_speculative(
        &self,
        req: &GenerateRequest,
        drafter: &mut DrafterBox,
        max_depth: usize,
        kind: &str,
        mut on_token: impl FnMut(&TokenOut) -> Flow,
    ) -> Result<(GenerateResult, SpecStats), EngineError> {
        let (start, mut caches, cached) = self.start_request(req)?;
        let mut d = Decoding::new(self, req)?;
        let mut stats =
            SpecStats { kind: kind.to_owned(), accepted_by_position: vec![0; max_depth], ..Default::default() };
        // A drafter that fails costs this request its speculation, not its answer.
        if let Err(e) = drafter.prefill(RSlice::from_slice(&req.prompt)).into_result() {
            stats.disabled = Some(format!("the drafter failed to prefill ({e}): plain steps"));
        }
        let mut depth = max_depth.max(1);
        let mut clock = clock::RoundClock::default();
        let judge = !self.speculate_always;
        // Pipelining: greedy only (a sampled round's verdict and next input
        // come from host-side draws and rejection tests), and by default
        // only for drafters that advertise it (a drafter should where it
        // measured a gain; no in-tree drafter does, docs/benchmarks.md).
        let advertised = self.drafter_caps.iter().any(|t| t == plugin_api::caps::DRAFT_AHEAD);
        let mut ahead = d.sampler.params.is_greedy()
            && match self.draft_ahead {
                crate::engine::DraftAhead::Auto => advertised,
                crate::engine::DraftAhead::On => true,
                crate::engine::DraftAhead::Off => false,
            };
        let mut gate = AheadGate::new();
        // Per-round timings on stderr, for diagnosing where a round's time goes.
        let trace = std::env::var_os("HOST_SPEC_TRACE").is_some();
        // The round on the device, and the cache-layout round it runs in.
        let mut queued: Option<Round> = None;
        let mut chain: Option<Chain> = None;
        let finish = 'gen: loop {
            let cur = match queued.take() {
                Some(r) => r,
                None => {
                    let room = req.max_tokens - d.out.len();
                    // Plain steps run in the pipelined plain loop: after a
                    // fallback (the request's remaining tokens), for the
                    // clock's reference samples, and when no room is left.
                    if stats.disabled.is_some() || room < 2 {
                        break 'gen self
                            .decode_plain(&mut d, &mut caches, usize::MAX, &mut on_token)?
                            .unwrap_or(Finish::Length);
                    }
                    if judge && clock.wants_plain_sample(d.out.len()) {
                        // Timed from the sample's first token to its last: the
                        // steady rate of the pipelined loop, which is what falling
                        // back gives (a sample's first step has nothing to overlap
                        // with; on the H200 it made 3-token samples cost 4.4 ms a
                        // token against 2.8 ms in a long run).
                        let (mut first, mut last) = (None, Instant::now());
                        let before = d.out.len();
                        let mut timed = |t: &TokenOut| {
                            last = Instant::now();
                            first.get_or_insert(last);
                            on_token(t)
                        };
                        if let Some(f) =
                            self.decode_plain(&mut d, &mut caches, clock::PLAIN_SAMPLE_TOKENS, &mut timed)?
                        {
                            break 'gen f;
                        }
                        let intervals = (d.out.len() - before).saturating_sub(1);
                        let seconds = first.map_or(0.0, |f: Instant| (last - f).as_secs_f64());
                        clock.plain(seconds, intervals);
                        if trace {
                            eprintln!("spec-trace plain intervals={intervals} ms={:.2}", seconds * 1e3);
                        }
                        continue;
                    }
                    let since = Instant::now();
                    // The drafter's answer is authoritative; 0 tokens = a plain
                    // step. Its probability rows q count only when sampling.
                    let n = depth.min(room - 1);
                    let args = DraftArgs {
                        history: RSlice::from_slice(&d.history),
                        max_tokens: n as u32,
                        sampling: draft_sampling(&d.sampler, d.history.len()),
                    };
                    // A drafter that fails costs this request its speculation, not its answer.
                    let (mut drafts, mut q) = match drafter.draft(args).into_result() {
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
                    if !drafts.is_empty() {
                        // A layout may refuse a round (a wrapped ring cannot
                        // roll back): then plain steps, and it says why.
                        let starts = caches.iter().map(|c| c.offset()).collect();
                        if let Some(e) = caches.iter_mut().find_map(|c| c.spec_begin().into_result().err()) {
                            stats.disabled = Some(format!(
                                "a cache layout refused a speculative round ({e}): plain steps from here"
                            ));
                            drafts.clear();
                            q = None;
                        } else {
                            chain = Some(Chain { starts, kept: Vec::new() });
                        }
                    }
                    let mut input = vec![*d.history.last().unwrap()];
                    input.extend_from_slice(&drafts);
                    let draft_s = since.elapsed().as_secs_f64();
                    self.queue_round(
                        token_array(&input),
                        q.as_ref(),
                        &drafts,
                        &mut caches,
                        &mut d.sampler,
                        since,
                        draft_s,
                    )?
                }
            };
            // Queue the next round before reading this one, while the
            // chain has room and this round leaves room for another.
            let room_after = req.max_tokens.saturating_sub(d.out.len() + cur.k + 1);
            let chain_room = chain.as_ref().is_some_and(|c| c.kept.len() + cur.k + 1 + depth < CHAIN_TOKENS);
            let next = if ahead
                && gate.open()
                && chain_room
                && !cur.rejection
                && cur.k > 0
                && stats.disabled.is_none()
                && room_after >= 2
            {
                self.queue_ahead(&cur, drafter, depth.min(room_after - 1), &mut caches, &mut d, &mut ahead)?
            } else {
                None
            };
            let waited = Instant::now();
            let v = Self::settle(&cur)?;
            let settled = Instant::now();
            let (k, n) = (cur.k, v.n);
            if k > 0 {
                gate.record(n == k);
                stats.rejection_sampling |= cur.rejection;
                depth = stats.record_round(k, n, max_depth, judge);
            }
            // Settle the caches and the drafter: a full accept with a round
            // queued behind it keeps the chain going; anything else ends it.
            stats.ahead_voided += u64::from(next.is_some() && n < k);
            match (chain.take(), next) {
                (Some(mut c), Some(next)) if n == k => {
                    c.kept.extend_from_slice(&v.input);
                    match drafter.commit(n as u32).into_result() {
                        Ok(()) => {
                            stats.ahead_rounds += 1;
                            chain = Some(c);
                            queued = Some(Round { since: settled, ..next });
                        }
                        Err(e) => {
                            stats.disabled = Some(crate::speculative::commit_failed(e));
                            self.close_chain(c, &[], false, &mut caches)?;
                        }
                    }
                }
                (Some(c), _) => {
                    self.close_chain(c, &v.input[..n + 1], n == k, &mut caches)?;
                    if let Err(e) = drafter.commit(n as u32).into_result() {
                        stats.disabled = Some(crate::speculative::commit_failed(e));
                    }
                }
                (None, _) => {}
            }
            if trace {
                let ms = |a: Instant, b: Instant| (b - a).as_secs_f64() * 1e3;
                eprintln!(
                    "spec-trace width={} accepted={n} ahead_queued={} draft_ms={:.2} graph_ms={:.2} launch_ms={:.2} build_ms={:.2} wait_ms={:.2} settle_ms={:.2}",
                    k + 1,
                    queued.is_some(),
                    cur.draft_s * 1e3,
                    cur.graph_s * 1e3,
                    cur.launch_s * 1e3,
                    ms(cur.since, waited) - cur.draft_s * 1e3,
                    ms(waited, settled),
                    ms(settled, Instant::now())
                );
            }
            // Time the round: plain samples are the reference; a request
            // whose rounds emit fewer tokens per second stops speculating.
            if k > 0 {
                clock.round(cur.since.elapsed().as_secs_f64(), k + 1, n + 1);
                if stats.disabled.is_none() && judge {
                    stats.disabled = clock.verdict();
                }
            }
            // Emit t_0..t_n with the serial loop's rules.
            for (i, &id) in v.t.iter().take(n + 1).enumerate() {
                d.first_at.get_or_insert_with(Instant::now);
                let stop = if d.eos.contains(&id) {
                    Some(Finish::Stop)
                } else {
                    let (logprob, top) = match req.logprobs {
                        Some(kk) => {
                            let lp = cur.lps.index(i as i32..i as i32 + 1);
                            (Some(lp.index_id(id)?), top_logprobs(&lp, kk)?)
                        }
                        None => (None, Vec::new()),
                    };
                    d.out.push(id);
                    d.history.push(id);
                    if on_token(&TokenOut { id, logprob, top }) == Flow::Stop {
                        Some(Finish::Stop)
                    } else {
                        (d.out.len() >= req.max_tokens).then_some(Finish::Length)
                    }
                };
                if let Some(f) = stop {
                    // A round queued ahead is dropped: the caches keep what
                    // the chain settled, which is what this round emitted.
                    if let (Some(c), Some(_)) = (chain.take(), queued.take()) {
                        self.close_chain(c, &[], false, &mut caches)?;
                    }
                    break 'gen f;
                }
            }
        };
        Ok((self.end_request(d, &mut caches, finish, cached, start), stats))
    }
}

#[cfg(test)]
mod tests {
    use super::AheadGate;

    #[test]
    fn the_gate_opens_after_two_full_rounds_and_closes_at_the_first_partial_one() {
        let mut g = AheadGate::new();
        assert!(!g.open());
        g.record(true);
        assert!(!g.open());
        g.record(true);
        assert!(g.open());
        g.record(true);
        assert!(g.open());
        g.record(false);
        assert!(!g.open());
        g.record(true);
        assert!(!g.open());
    }
}
