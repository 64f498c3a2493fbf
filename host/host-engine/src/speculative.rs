//! Speculative decoding, serial, over the `Drafter` ABI.
//!
//! Each round: the drafter proposes d1..dk continuing the history (k is its
//! answer; 0 means "take a plain step"); ONE target forward over
//! `[pending, d1..dk]` computes logits at every position. Verification, in
//! one device evaluation, keeps the target's distribution:
//! - greedy, or sampling with drafts that came without probabilities: the
//!   target's own choice t_i at each position is drawn as in plain decoding
//!   (argmax, or a sample with the request's key); d_(i+1) is accepted while
//!   it equals t_i; the first mismatch emits the target's token (a full
//!   accept emits the bonus token). Sampled, this accepts d with p(d) only;
//! - sampling with the drafter's probability rows q: rejection sampling
//!   (`rejection`) against the target's processed distribution p, which
//!   accepts d with min(1, p(d)/q(d)).
//!
//! The caches are rolled back through the layouts'
//! speculative round to keep `pending + accepted drafts`: by trim, or for
//! recurrent state by restoring the round's snapshot and replaying the kept
//! tokens (`replay_if_restored`).
//!
//! Adaptive: each round drafts up to two tokens past what the last round
//! accepted; when acceptance stays low, or timed rounds emit fewer tokens
//! per second than timed plain steps (`clock.rs`), the request hands the
//! rest of its tokens to the pipelined plain loop (`decode_plain`, the same
//! loop that times the plain reference) and says so. Rounds themselves are
//! synchronous: the next round's input depends on this round's verdict.

pub(crate) mod clock;
pub(crate) mod rejection;

use crate::engine::{Engine, EngineError};
use crate::generate::{token_array, Decoding, Finish, Flow, GenerateRequest, GenerateResult, TokenOut};
use crate::sampling::{top_logprobs, Sampler};
use mlx_rs::Array;
use plugin_api::abi_stable::std_types::{ROption, RSlice};
use plugin_api::{CacheBox, DraftArgs, DraftSampling, DrafterBox, ForwardArgs, LogitsMode, TensorRef};
use std::time::Instant;

/// What speculation did for one request.
#[derive(Debug, Clone, Default)]
pub struct SpecStats {
    pub kind: String,
    pub drafted: u64,
    pub accepted: u64,
    pub rounds: u64,
    /// `accepted_by_position[i]`: rounds whose draft i+1 was accepted.
    pub accepted_by_position: Vec<u64>,
    /// Set when the request stopped speculating, with the reason.
    pub disabled: Option<String>,
    /// Some round verified the drafter's probability rows by rejection
    /// sampling (else drafts were verified by exact match).
    pub rejection_sampling: bool,
}

impl SpecStats {
    /// The `speculation` report of `generate --json` and HTTP `usage`.
    pub fn report(&self) -> serde_json::Value {
        serde_json::json!({
            "kind": self.kind,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "rounds": self.rounds,
            "acceptance": if self.drafted > 0 { self.accepted as f64 / self.drafted as f64 } else { 0.0 },
            "accepted_by_position": self.accepted_by_position,
            "disabled": self.disabled,
            "rejection_sampling": self.rejection_sampling,
        })
    }
}

/// Rounds before acceptance is judged, and the acceptance below which
/// rounds cost more than they save.
const PROBATION_ROUNDS: u64 = 4;
const MIN_ACCEPTANCE: f64 = 0.15;

impl SpecStats {
    /// Counts one round that drafted `drafted` and accepted `accepted`, and
    /// returns the next depth: about as far as this round got, plus a little
    /// (long drafts cut short cost verify work for nothing). Switches the
    /// request to plain steps when acceptance stays too low to pay.
    /// With `judge` false (`--speculate-always`) the request never falls back.
    pub fn record_round(&mut self, drafted: usize, accepted: usize, max_depth: usize, judge: bool) -> usize {
        self.rounds += 1;
        self.drafted += drafted as u64;
        self.accepted += accepted as u64;
        for p in self.accepted_by_position.iter_mut().take(accepted) {
            *p += 1;
        }
        let rate = self.accepted as f64 / self.drafted.max(1) as f64;
        if judge && self.rounds >= PROBATION_ROUNDS && rate < MIN_ACCEPTANCE && self.disabled.is_none() {
            self.disabled = Some(format!("acceptance {:.0}% after {} rounds is below {:.0}%: plain steps from here", rate * 100.0, self.rounds, MIN_ACCEPTANCE * 100.0));
        }
        (accepted + 2).clamp(1, max_depth.max(1))
    }
}

/// What a drafter is told about the request's sampling at `position` (the
/// history's length): the parameters, and a seed for its own draws.
pub(crate) fn draft_sampling(sampler: &Sampler, position: usize) -> DraftSampling {
    let p = &sampler.params;
    DraftSampling { temperature: p.temperature, top_p: p.top_p, top_k: p.top_k, min_p: p.min_p, seed: sampler.draft_seed(position as u64) }
}

/// The drafter's probability rows q for its first `n` drafts, float32
/// `[n, V]`, when they count: the request samples, something was drafted,
/// and the rows have that shape. None: the round verifies by exact match.
pub(crate) fn draft_probability_rows(rows: ROption<plugin_api::Tensor>, sampler: &Sampler, n: usize) -> Option<Array> {
    use mlx_rs::ops::indexing::IndexOp;
    let t = rows.into_option().filter(|_| !sampler.params.is_greedy() && n > 0)?;
    let q = unsafe { Array::from_ptr(t.into_raw()) };
    if q.ndim() != 2 || (q.shape()[0] as usize) < n {
        return None;
    }
    q.index(0..n as i32).as_dtype(mlx_rs::Dtype::Float32).ok()
}

fn tensor_ref(a: &Array) -> TensorRef<'_> {
    unsafe { TensorRef::from_raw(a.as_ptr()) }
}

impl Engine {
    /// Logits `[k+1, V]` at every position of `tokens` `[1, k+1]`.
    pub(crate) fn forward_all(&self, tokens: &Array, caches: &mut [CacheBox]) -> Result<Array, EngineError> {
        let args = ForwardArgs { tokens: tensor_ref(tokens), logits: LogitsMode::ALL, want_hidden: false, taps: RSlice::from_slice(&[]) };
        let out = self.model.graph.forward(args, caches.into()).into_result().map_err(|e| EngineError::Model(e.to_string()))?;
        let l = match out.logits {
            ROption::RSome(t) => unsafe { Array::from_ptr(t.into_raw()) },
            ROption::RNone => return Err(EngineError::Model("forward returned no logits".into())),
        };
        let v = l.shape()[l.ndim() - 1];
        Ok(l.reshape(&[-1, v])?)
    }

    /// Snapshot-and-replay rollback (`caps::SPEC_REPLAY`): a layout that
    /// cannot trim (recurrent state) restores the state it had at the
    /// round's start instead of keeping `kept` tokens. Then every layout is
    /// brought back to the round's start and the kept tokens run through
    /// the model again, so all layers agree on what the cache holds.
    pub(crate) fn replay_if_restored(&self, starts: &[u64], kept: &[u32], caches: &mut [CacheBox]) -> Result<bool, EngineError> {
        let n = kept.len() as u64;
        if caches.iter().zip(starts).all(|(c, &s)| c.offset() == s + n) {
            return Ok(false);
        }
        for (c, &s) in caches.iter_mut().zip(starts) {
            let extra = c.offset().saturating_sub(s);
            if extra > 0 && c.trim(extra) != extra {
                return Err(EngineError::Model(format!("rollback: a layout holds {extra} tokens past the round's start and cannot trim them (signature {})", c.signature())));
            }
        }
        self.forward(&token_array(kept), caches, false)?.eval()?;
        Ok(true)
    }

    pub fn generate_speculative(&self, req: &GenerateRequest, drafter: &mut DrafterBox, max_depth: usize, kind: &str, mut on_token: impl FnMut(&TokenOut) -> Flow) -> Result<(GenerateResult, SpecStats), EngineError> {
        if req.prompt.is_empty() {
            return Err(EngineError::InvalidRequest("the prompt is empty".into()));
        }
        req.params.validate().map_err(EngineError::InvalidRequest)?;
        let start = Instant::now();
        let mut caches = self.new_caches()?;
        let (head, _) = req.prompt.split_at(req.prompt.len() - 1);
        let cached = self.prefix_take(&req.prompt, &mut caches);
        self.prefill(&head[cached..], &mut caches)?;
        drafter.prefill(RSlice::from_slice(&req.prompt)).into_result().map_err(|e| EngineError::Model(format!("drafter: {e}")))?;
        let mut d = Decoding::new(self, req)?;
        let mut stats = SpecStats { kind: kind.to_owned(), accepted_by_position: vec![0; max_depth], ..Default::default() };
        let mut depth = max_depth.max(1);
        let mut clock = clock::RoundClock::default();
        let judge = !self.speculate_always;
        // Per-round timings on stderr, for diagnosing where a round's time goes.
        let trace = std::env::var_os("HOST_SPEC_TRACE").is_some();
        let finish = 'gen: loop {
            let room = req.max_tokens - d.out.len();
            // Plain steps run in the pipelined plain loop: after a fallback
            // (the request's remaining tokens), for the clock's reference
            // samples, and when no room is left for a draft.
            if stats.disabled.is_some() || room < 2 {
                break 'gen self.decode_plain(&mut d, &mut caches, usize::MAX, &mut on_token)?.unwrap_or(Finish::Length);
            }
            if judge && clock.wants_plain_sample(d.out.len()) {
                let (t0, before) = (Instant::now(), d.out.len());
                if let Some(f) = self.decode_plain(&mut d, &mut caches, clock::PLAIN_SAMPLE_TOKENS, &mut on_token)? {
                    break 'gen f;
                }
                clock.plain(t0.elapsed().as_secs_f64(), d.out.len() - before);
                if trace {
                    eprintln!("spec-trace plain tokens={} ms={:.2}", d.out.len() - before, t0.elapsed().as_secs_f64() * 1e3);
                }
                continue;
            }
            let step_start = Instant::now();
            // The drafter's answer is authoritative; 0 tokens = a plain step.
            // Its probability rows q count only when the request samples.
            let n = depth.min(room - 1);
            let args = DraftArgs { history: RSlice::from_slice(&d.history), max_tokens: n as u32, sampling: draft_sampling(&d.sampler, d.history.len()) };
            // A drafter that fails costs this request its speculation, not its answer.
            let (mut drafts, mut q): (Vec<u32>, Option<Array>) = match drafter.draft(args).into_result() {
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
            let drafted_at = Instant::now();
            let pending = *d.history.last().unwrap();
            let starts: Vec<u64> = caches.iter().map(|c| c.offset()).collect();
            if !drafts.is_empty() {
                // A layout may refuse a round (a wrapped ring cannot roll back):
                // then this request takes plain steps, and says why.
                if let Some(e) = caches.iter_mut().find_map(|c| c.spec_begin().into_result().err()) {
                    stats.disabled = Some(format!("a cache layout refused a speculative round ({e}): plain steps from here"));
                    drafts.clear();
                    q = None;
                }
            }
            let mut input = vec![pending];
            input.extend_from_slice(&drafts);
            let logits = self.forward_all(&token_array(&input), &mut caches)?;
            // Verify in one evaluation: one logprobs op over all rows
            // (reductions stay within a row), then rejection sampling
            // against q, or the target's own choice at every position (one
            // argmax when greedy, one draw per position otherwise).
            let all = Sampler::logprobs(&logits)?;
            let lps: Vec<Array> = (0..input.len() as i32)
                .map(|i| {
                    use mlx_rs::ops::indexing::IndexOp;
                    all.index(i..i + 1)
                })
                .collect();
            let (t, n) = if let Some(q) = &q {
                stats.rejection_sampling = true;
                let v = rejection::verdict(&d.sampler.probabilities(&all)?, q, &drafts, &mut d.sampler)?;
                v.eval()?;
                rejection::emitted(v.as_slice::<u32>(), &drafts)
            } else {
                let t = if d.sampler.params.is_greedy() {
                    mlx_rs::ops::indexing::argmax_axis(&all, -1, None)?
                } else {
                    let draws = lps.iter().map(|lp| d.sampler.sample(lp)).collect::<Result<Vec<_>, _>>()?;
                    mlx_rs::ops::concatenate(&draws, 0)?
                };
                let t = t.as_dtype(mlx_rs::Dtype::Uint32)?;
                t.eval()?;
                let t: Vec<u32> = t.as_slice::<u32>().to_vec();
                let n = drafts.iter().zip(&t).take_while(|(d, t)| d == t).count();
                (t, n)
            };
            let verified_at = Instant::now();
            if !drafts.is_empty() {
                depth = stats.record_round(drafts.len(), n, max_depth, judge);
            }
            let round_drafted = !drafts.is_empty();
            // Keep pending + the accepted drafts; drop the rest.
            let keep = [(n + 1) as u64];
            for c in caches.iter_mut().filter(|_| !drafts.is_empty()) {
                if n == drafts.len() {
                    c.spec_commit().into_result().map_err(|e| EngineError::Model(format!("spec_commit: {e}")))?;
                } else {
                    c.spec_rollback(RSlice::from_slice(&keep)).into_result().map_err(|e| EngineError::Model(format!("spec_rollback: {e}")))?;
                }
            }
            if !drafts.is_empty() && n < drafts.len() {
                self.replay_if_restored(&starts, &input[..n + 1], &mut caches)?;
            }
            if !drafts.is_empty() && stats.disabled.is_none() {
                if let Err(e) = drafter.commit(n as u32).into_result() {
                    stats.disabled = Some(format!("the drafter failed to commit ({e}): plain steps from here"));
                }
            }
            // Time the step: plain samples are the reference; a request
            // whose rounds emit fewer tokens per second stops speculating.
            if trace {
                let ms = |a: Instant, b: Instant| (b - a).as_secs_f64() * 1e3;
                eprintln!(
                    "spec-trace width={} accepted={n} offset={} draft_ms={:.2} verify_ms={:.2} rollback_ms={:.2}",
                    input.len(),
                    starts.first().copied().unwrap_or(0),
                    ms(step_start, drafted_at),
                    ms(drafted_at, verified_at),
                    ms(verified_at, Instant::now())
                );
            }
            if round_drafted {
                clock.round(step_start.elapsed().as_secs_f64(), input.len(), n + 1);
                if stats.disabled.is_none() && judge {
                    stats.disabled = clock.verdict();
                }
            }
            // Emit t_0..t_n with the serial loop's rules.
            for (i, &id) in t.iter().take(n + 1).enumerate() {
                d.first_at.get_or_insert_with(Instant::now);
                if d.eos.contains(&id) {
                    break 'gen Finish::Stop;
                }
                let (logprob, top) = match req.logprobs {
                    Some(kk) => {
                        use mlx_rs::ops::indexing::IndexOp;
                        let chosen = lps[i].index((0, id as i32)).as_dtype(mlx_rs::Dtype::Float32)?.try_item_cast::<f32>()?;
                        (Some(chosen), top_logprobs(&lps[i], kk)?)
                    }
                    None => (None, Vec::new()),
                };
                d.out.push(id);
                d.history.push(id);
                if on_token(&TokenOut { id, logprob, top }) == Flow::Stop {
                    break 'gen Finish::Stop;
                }
                if d.out.len() >= req.max_tokens {
                    break 'gen Finish::Length;
                }
            }
        };
        let Decoding { history, out, first_at, .. } = d;
        let first_at = first_at.unwrap_or_else(Instant::now);
        self.prefix_put_final(&history, &mut caches);
        Ok((
            GenerateResult { tokens: out, finish, prompt_tokens: req.prompt.len(), cached_tokens: cached, prefill_s: (first_at - start).as_secs_f64(), decode_s: first_at.elapsed().as_secs_f64(), speculation: None },
            stats,
        ))
    }
}

