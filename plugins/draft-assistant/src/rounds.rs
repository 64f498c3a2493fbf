//! The round loop's drafter side, as mlx-vlm 0.7.10's `_mtp_rounds` runs
//! an assistant.
//!
//! A round drafts from the token the target emitted last (the history's
//! last, pending) and the target's hidden state after its final norm at
//! the position before it, the newest verified one: that state predicted
//! the pending token. Every step of the round reads the same K/V, the
//! target's caches as the round starts (`draft_kv`), and puts its queries
//! at one position, the newest verified one, `cache length − 1`: mlx-vlm's
//! convention (Hugging Face's candidate generator uses the cache length,
//! mlx-optiq the cache length plus the draft's index; the tests check
//! against mlx-vlm). Each step feeds the next its drafted token and the
//! hidden state `post_projection` gave. The drafter keeps no cache.
//!
//! The hidden state comes with each verify (`commit_states`): the row of
//! the last accepted token. After the prompt there is none yet (the
//! host's prefill keeps states only for the positions before the last), so
//! the first round drafts nothing: its verify of the pending token alone
//! emits the token mlx-vlm's prefill emits, and brings the state. A round
//! after positions the host ran without states (plain steps) drafts
//! nothing for the same reason.
//!
//! Sliding layers see keys within `sliding_window` of the query
//! (bidirectional in mlx-vlm, but no key lies past the query): the last
//! `sliding_window` positions of the lent view.

use crate::net::{Kv, Net, Views};
use plugin_api::abi_stable::std_types::{ROption, RSlice, RVec};
use plugin_api::*;
use plugin_sdk::draft_sampling::Picker;
use plugin_sdk::mlx_rs::ops::indexing::IndexOp;
use plugin_sdk::mlx_rs::{self, Array};
use plugin_sdk::{guard, into_array, into_tensor, lend, mlx_error, to_array, Locked};
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

/// The target's hidden state a round starts from, and the history length
/// it belongs to (its token's successor is the history's last).
struct Seed {
    hidden: Array,
    at: usize,
}

pub struct Assistant {
    net: Arc<Locked<Net>>,
    host: HostServicesBox,
    /// `sqrt(target hidden size)`: the target's embedding scale.
    embed_scale: f32,
    window: usize,
    /// The picks `target_kv` returns: (sliding, full) as the layers need them.
    picks: Vec<KvPick>,
    depth: usize,
    seed: Option<Seed>,
    /// Tokens known to the target: the history length after the last
    /// verify (verified tokens + the one it emitted).
    history: usize,
    /// The drafts of the round in flight.
    drafts: Vec<u32>,
    /// Writes each round's draft logits, drafts and accepted count as JSON
    /// lines (the option `trace=<file>`; parity tests read it).
    trace: Option<PathBuf>,
    trace_rows: Vec<Vec<f32>>,
}

pub struct Setup {
    pub net: Arc<Locked<Net>>,
    pub host: HostServicesBox,
    pub embed_scale: f32,
    pub window: usize,
    pub depth: usize,
    pub trace: Option<PathBuf>,
}

impl Assistant {
    pub fn new(s: Setup) -> Self {
        let (sliding, full) = s.net.lock().kinds();
        let mut picks = Vec::new();
        if sliding {
            picks.push(KvPick { role: KvRole::LAST_SLIDING, index: 0 });
        }
        if full {
            picks.push(KvPick { role: KvRole::LAST_FULL, index: 0 });
        }
        Self {
            net: s.net,
            host: s.host,
            embed_scale: s.embed_scale,
            window: s.window,
            picks,
            depth: s.depth,
            seed: None,
            history: 0,
            drafts: Vec::new(),
            trace: s.trace,
            trace_rows: Vec::new(),
        }
    }

    /// The lent views as the layers read them, and the query position.
    fn views(&self, kv: &[TargetKv<'_>]) -> Result<(Views, u64), PluginError> {
        if kv.len() != self.picks.len() {
            return Err(PluginError::invalid_input(format!(
                "assistant: {} K/V views lent, {} asked for",
                kv.len(),
                self.picks.len()
            )));
        }
        let mut views = Views { sliding: None, full: None };
        let mut newest = None;
        for (pick, v) in self.picks.iter().zip(kv) {
            let (keys, values) = (to_array(v.keys), to_array(v.values));
            let len = keys.shape()[2] as u64;
            let last = (v.first + len)
                .checked_sub(1)
                .ok_or_else(|| PluginError::invalid_input("assistant: an empty K/V view"))?;
            if newest.is_some_and(|n| n != last) {
                return Err(PluginError::invalid_input("assistant: the lent views end at different positions"));
            }
            newest = Some(last);
            if pick.role == KvRole::LAST_SLIDING {
                let keep = (len as i32).min(self.window as i32);
                let cut = |a: &Array| a.index((.., .., (len as i32 - keep).., ..));
                views.sliding = Some(Kv { keys: cut(&keys), values: cut(&values) });
            } else {
                views.full = Some(Kv { keys, values });
            }
        }
        Ok((views, newest.unwrap_or(0)))
    }

    fn record(&mut self, line: serde_json::Value) {
        if let Some(path) = &self.trace {
            if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
                let _ = writeln!(f, "{line}");
            }
        }
    }

    fn draft_round(
        &mut self,
        history: &[u32],
        n: usize,
        sampling: DraftSampling,
        kv: &[TargetKv<'_>],
    ) -> Result<Draft, PluginError> {
        self.history = history.len();
        self.drafts.clear();
        let none = || Draft { tokens: RVec::new(), probabilities: ROption::RNone };
        let seed = match self.seed.take() {
            Some(s) if s.at == history.len() && n > 0 => s,
            _ => return Ok(none()),
        };
        let (views, newest) = self.views(kv)?;
        // The views hold every verified token: the newest sits just before
        // the pending one.
        if newest as usize + 2 != history.len() {
            return Err(PluginError::invalid_input(format!(
                "assistant: the target's K/V ends at position {newest}, the history has {} tokens",
                history.len()
            )));
        }
        let at = newest as i32;
        let mut picker = Picker::new(sampling).map_err(mlx_error)?;
        let last = *history.last().expect("a history has a token") as i32;
        let mut ids = Array::from_slice(&[last], &[1, 1]);
        let mut hidden = seed.hidden;
        let (mut picked, mut logits) = (Vec::with_capacity(n), Vec::with_capacity(n));
        let net = self.net.lock();
        // The chain stays on the device; the drafts are read back once.
        for _ in 0..n {
            let e = into_array(self.host.target_embed(lend(&ids)).into_result()?);
            let e = e
                .multiply(Array::from_f32(self.embed_scale).as_dtype(e.dtype()).map_err(mlx_error)?)
                .map_err(mlx_error)?;
            let hidden_in = hidden.as_dtype(e.dtype()).map_err(mlx_error)?;
            let step = net.step(&e, &hidden_in, &views, at).map_err(mlx_error)?;
            let v = step.logits.shape()[2];
            let row =
                step.logits.reshape(&[1, v]).and_then(|l| l.as_dtype(mlx_rs::Dtype::Float32)).map_err(mlx_error)?;
            let token = picker.pick(&row).map_err(mlx_error)?;
            ids = token.as_dtype(mlx_rs::Dtype::Int32).and_then(|t| t.reshape(&[1, 1])).map_err(mlx_error)?;
            picked.push(token);
            logits.push(row);
            hidden = step.hidden;
        }
        drop(net);
        let all =
            mlx_rs::ops::concatenate(&picked, 0).and_then(|a| a.as_dtype(mlx_rs::Dtype::Uint32)).map_err(mlx_error)?;
        // q is evaluated here too: left lazy it would hold the target's
        // storage through the verify, whose in-place write would then copy it.
        let q = picker.probabilities().map_err(mlx_error)?;
        let mut evaluated: Vec<&Array> = vec![&all];
        evaluated.extend(q.iter());
        if self.trace.is_some() {
            evaluated.extend(logits.iter());
        }
        mlx_rs::transforms::eval(evaluated).map_err(mlx_error)?;
        self.drafts = all.as_slice::<u32>().to_vec();
        if self.trace.is_some() {
            self.trace_rows = logits.iter().map(|l| l.as_slice::<f32>().to_vec()).collect();
        }
        Ok(Draft { tokens: RVec::from(self.drafts.clone()), probabilities: q.map(into_tensor).into() })
    }

    fn commit_round(&mut self, accepted: usize, states: &TargetStates<'_>) -> Result<(), PluginError> {
        let drafts = std::mem::take(&mut self.drafts);
        let ROption::RSome(verified) = states.hidden else {
            return Err(PluginError::invalid_input("assistant: the host lent no hidden states"));
        };
        if states.len == 0 {
            self.seed = None;
            return Ok(());
        }
        let a = accepted.min(states.len as usize - 1);
        let hidden = to_array(verified).index((.., a as i32..a as i32 + 1, ..));
        self.history += a + 1;
        self.seed = Some(Seed { hidden, at: self.history });
        if self.trace.is_some() && !drafts.is_empty() {
            let rows = std::mem::take(&mut self.trace_rows);
            self.record(serde_json::json!({"drafts": drafts, "accepted": a.min(drafts.len()), "logits": rows}));
        }
        Ok(())
    }
}

impl Drafter for Assistant {
    fn prefill(&mut self, prompt: RSlice<'_, u32>) -> PResult<()> {
        self.history = prompt.len();
        self.seed = None;
        self.drafts.clear();
        PResult::ROk(())
    }

    fn draft(&mut self, args: DraftArgs<'_>) -> PResult<Draft> {
        // Only reached from a host that lends no K/V: nothing to attend.
        self.history = args.history.len();
        self.drafts.clear();
        PResult::ROk(Draft { tokens: RVec::new(), probabilities: ROption::RNone })
    }

    fn commit(&mut self, accepted: u32) -> PResult<()> {
        // Without states the next round has no hidden state to start from.
        self.history += accepted as usize + 1;
        self.seed = None;
        self.drafts.clear();
        PResult::ROk(())
    }

    fn target_wants(&self) -> TargetWants {
        TargetWants { hidden: true, taps: RVec::new() }
    }

    fn prefill_states(&mut self, prompt: RSlice<'_, u32>, _states: TargetStates<'_>) -> PResult<()> {
        self.prefill(prompt)
    }

    fn commit_states(&mut self, accepted: u32, states: TargetStates<'_>) -> PResult<()> {
        guard(|| self.commit_round(accepted as usize, &states))
    }

    fn target_kv(&self) -> RVec<KvPick> {
        RVec::from(self.picks.clone())
    }

    fn draft_kv(&mut self, args: DraftArgs<'_>, kv: RSlice<'_, TargetKv<'_>>) -> PResult<Draft> {
        guard(|| {
            let n = (args.max_tokens as usize).min(self.depth);
            self.draft_round(args.history.as_slice(), n, args.sampling, kv.as_slice())
        })
    }
}
