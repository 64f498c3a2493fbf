//! What speculative decoding shares between the serial executor
//! (`serial::speculative`) and rounds inside a batch (`batch::spec_round`).
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
//! The caches are rolled back through the layouts' speculative round to
//! keep `pending + accepted drafts`: by trim; for recurrent state by the
//! state after the last kept position when the graph handed the verify's
//! position states, else by restoring the round's snapshot and replaying
//! the kept tokens (`replays` counts those rounds).
//!
//! Pipelined (serial, greedy, no grammar, a drafter that reads target
//! states and answers `draft_ahead`, layouts whose rounds may overlap):
//! the next round is drafted and verified on the device before this
//! round's verdict is read, as if this round accepts every draft; a
//! verdict that falls short drops it with the rest of this round
//! (`serial::ahead`).
//!
//! Adaptive: each round drafts up to two tokens past what the last round
//! accepted; when acceptance stays low, or timed rounds emit fewer tokens
//! per second than timed plain steps (`clock`), the request hands the rest
//! of its tokens to plain steps and says so.

pub(crate) mod clock;
pub(crate) mod rejection;

use crate::sampling::Sampler;
use mlx_rs::Array;
use plugin_api::abi_stable::std_types::ROption;
use plugin_api::DraftSampling;

/// What speculation did for one request.
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, Default)]
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
    /// Rounds whose rollback ran the kept tokens again (a snapshot layout
    /// without the verify's position states).
    #[serde(default)]
    pub replays: u64,
    /// Rounds drafted and queued before the previous round's verdict was
    /// read (pipelined), and kept because that round accepted every draft.
    #[serde(default)]
    pub pipelined: u64,
    /// Rounds queued that way and dropped: the round before fell short, or
    /// the request ended there.
    #[serde(default)]
    pub pipelined_dropped: u64,
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
            "replays": self.replays,
            "pipelined": self.pipelined,
            "pipelined_dropped": self.pipelined_dropped,
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
    /// (long drafts cut short cost verify work for nothing), up to
    /// `max_depth`; always `max_depth` for a drafter of `fixed` depth.
    /// Switches the request to plain steps when acceptance stays too low to
    /// pay. With `judge` false (`--speculate-always`) it never falls back.
    pub fn record_round(
        &mut self,
        drafted: usize,
        accepted: usize,
        max_depth: usize,
        judge: bool,
        fixed: bool,
    ) -> usize {
        self.rounds += 1;
        self.drafted += drafted as u64;
        self.accepted += accepted as u64;
        for p in self.accepted_by_position.iter_mut().take(accepted) {
            *p += 1;
        }
        let rate = self.accepted as f64 / self.drafted.max(1) as f64;
        if judge && self.rounds >= PROBATION_ROUNDS && rate < MIN_ACCEPTANCE && self.disabled.is_none() {
            self.disabled = Some(format!(
                "acceptance {:.0}% after {} rounds is below {:.0}%: plain steps from here",
                rate * 100.0,
                self.rounds,
                MIN_ACCEPTANCE * 100.0
            ));
        }
        next_depth(accepted, max_depth, fixed)
    }
}

/// The depth of the round after one that accepted `accepted` drafts.
pub(crate) fn next_depth(accepted: usize, max_depth: usize, fixed: bool) -> usize {
    if fixed {
        max_depth.max(1)
    } else {
        (accepted + 2).clamp(1, max_depth.max(1))
    }
}

/// What a drafter is told about the request's sampling at `position` (the
/// history's length): the parameters, and a seed for its own draws.
pub(crate) fn draft_sampling(sampler: &Sampler, position: usize) -> DraftSampling {
    let p = &sampler.params;
    DraftSampling {
        temperature: p.temperature,
        top_p: p.top_p,
        top_k: p.top_k,
        min_p: p.min_p,
        seed: sampler.draft_seed(position as u64),
    }
}

/// The drafter's probability rows q for its first `n` drafts, float32
/// `[n, V]`, when they count: the request samples, something was drafted,
/// and the rows have that shape. None: the round verifies by exact match.
pub(crate) fn draft_probability_rows(rows: ROption<plugin_api::Tensor>, sampler: &Sampler, n: usize) -> Option<Array> {
    use mlx_rs::ops::indexing::IndexOp;
    let t = rows.into_option().filter(|_| !sampler.params.is_greedy() && n > 0)?;
    let q = crate::tensors::tensor_array(t);
    if q.ndim() != 2 || (q.shape()[0] as usize) < n {
        return None;
    }
    q.index(0..n as i32).as_dtype(mlx_rs::Dtype::Float32).ok()
}

/// Why speculation stopped when a drafter could not commit a verdict (the
/// request continues with plain steps).
pub(crate) fn commit_failed(e: impl std::fmt::Display) -> String {
    format!("the drafter failed to commit ({e}): plain steps from here")
}

/// What a round emits and how many drafts it accepted, from its evaluated
/// verdict: the rejection-sampling verdict `[2k+1]`, or the target's
/// choice at every position `[k+1]`, whose drafts count while they match.
pub(crate) fn emitted(out: &[u32], drafts: &[u32], rejection: bool) -> (Vec<u32>, usize) {
    if rejection {
        return rejection::emitted(out, drafts);
    }
    let t = out[..drafts.len() + 1].to_vec();
    let n = drafts.iter().zip(&t).take_while(|(d, t)| d == t).count();
    (t, n)
}
