//! The round loop's drafter side, as mlx-vlm 0.7.10's `_dflash_rounds`
//! keeps it (fixed width). Sampled requests draw each draft from the
//! request's processed distribution and return those distributions, so the
//! host verifies by rejection sampling.
//!
//! The drafter's cache holds context K/V, one row per position whose
//! target taps it has seen: the prompt's (from `prefill_states`) and each
//! round's verified rows (the pending token's and the accepted drafts').
//! Rows arrive at commit and enter the cache with the next block, as the
//! reference feeds `hidden` to `draft_block`. A round drafts from the
//! block `[anchor, mask…]` anchored at the history's last (unverified)
//! token; rejected drafts never enter the cache, so nothing is trimmed.
//!
//! The first round after the prompt drafts nothing (a plain step): the
//! reference's prefill yields the first token from the prompt's last
//! position before any block runs, and its first block is anchored at that
//! token with the whole prompt as context; this keeps every later round
//! identical to the reference's.

use crate::block::Positions;
use crate::net::Net;
use plugin_api::abi_stable::std_types::{ROption, RSlice, RVec};
use plugin_api::*;
use plugin_sdk::draft_sampling::Picker;
use plugin_sdk::mlx_rs::{self, ops, Array, Dtype};
use plugin_sdk::Locked;
use plugin_sdk::{guard, into_array, into_tensor, lend, mlx_error};
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

/// What a drafter of this kind is, beyond its weights.
pub struct Shape {
    pub proposals: usize,
    pub mask_token_id: u32,
    pub sample_from_anchor: bool,
    pub softcap: Option<f32>,
    pub taps: Vec<u32>,
    /// Per-position confidence thresholds (the last repeats), empty = none.
    pub thresholds: Vec<f32>,
    /// The full verify width and DSpark's sliding window (`config::ceiling`).
    pub width: usize,
    pub window: Option<usize>,
}

/// Context rows not yet in the cache: taps `[1, S, n·H]` from `first` on.
struct Context {
    first: usize,
    taps: Array,
}

struct Round {
    drafts: Vec<u32>,
}

struct Chosen {
    drafts: Vec<u32>,
    /// The logits each draft was chosen from (greedy drafts without a
    /// Markov head: only when tracing).
    logits: Vec<Array>,
    /// float32 `[k, V]`: the distribution each draft was drawn from.
    q: Option<Array>,
}

pub struct BlockDrafter {
    net: Arc<Locked<Net>>,
    shape: Shape,
    caches: Vec<CacheBox>,
    host: HostServicesBox,
    pending: Option<Context>,
    /// A verify has brought rows since the prompt: blocks may run.
    seeded: bool,
    /// This request's proposals per round (the width ceiling's, by its prompt).
    proposals: usize,
    round: Option<Round>,
    /// Writes each round's draft logits, drafts, confidences and accepted
    /// count as JSON lines (the option `trace=<file>`; parity tests read it).
    trace: Option<PathBuf>,
    trace_rows: (Vec<Vec<f32>>, Vec<f32>),
}

impl BlockDrafter {
    pub fn new(
        net: Arc<Locked<Net>>,
        shape: Shape,
        caches: Vec<CacheBox>,
        host: HostServicesBox,
        trace: Option<PathBuf>,
    ) -> Self {
        Self {
            proposals: shape.proposals,
            net,
            shape,
            caches,
            host,
            pending: None,
            seeded: false,
            round: None,
            trace,
            trace_rows: Default::default(),
        }
    }

    fn embed(&self, ids: &[u32]) -> Result<Array, PluginError> {
        let v: Vec<i32> = ids.iter().map(|&t| t as i32).collect();
        let ids = Array::from_slice(&v, &[1, v.len() as i32]);
        match &self.net.lock().vocab {
            Some(vocab) => vocab.embed(&ids).map_err(mlx_error),
            None => Ok(into_array(self.host.target_embed(lend(&ids)).into_result()?)),
        }
    }

    /// The logits of `rows`: over the drafter's own vocabulary (DeepSpec),
    /// its reduced draft vocabulary (speculators'), else the target's.
    fn logits(&self, rows: &Array) -> Result<Array, PluginError> {
        let net = self.net.lock();
        let target = |r: &Array| -> Result<Array, PluginError> {
            Ok(into_array(self.host.target_lm_head(lend(r)).into_result()?))
        };
        match (&net.vocab, &net.draft_vocab) {
            (Some(vocab), _) => vocab.logits(rows).map_err(mlx_error),
            (None, Some(dv)) => match dv.head() {
                Some(head) => head.forward(rows).map_err(mlx_error),
                None => dv.columns(&target(rows)?).map_err(mlx_error),
            },
            (None, None) => target(rows),
        }
    }

    /// Rows `first..` of the verified taps join the context.
    fn push_context(&mut self, first: usize, taps: Array) -> Result<(), PluginError> {
        self.pending = Some(match self.pending.take() {
            Some(p) if p.first + p.taps.shape()[1] as usize == first => {
                Context { first: p.first, taps: ops::concatenate(&[p.taps, taps], 1).map_err(mlx_error)? }
            }
            // A gap (positions run without states): the older rows enter
            // the cache on their own, at their positions.
            Some(p) => {
                self.absorb(p)?;
                Context { first, taps }
            }
            None => Context { first, taps },
        });
        Ok(())
    }

    fn absorb(&mut self, c: Context) -> Result<(), PluginError> {
        let out = self.net.lock().block.absorb(&c.taps, c.first as i32, &mut self.caches).map_err(mlx_error)?;
        mlx_rs::transforms::eval(out.iter()).map_err(mlx_error)
    }

    fn reset(&mut self) -> Result<(), PluginError> {
        for c in self.caches.iter_mut() {
            let held = c.offset();
            if held > 0 && c.trim(held) != held {
                return Err(PluginError::unsupported("the drafter's cache cannot be cleared"));
            }
        }
        self.pending = None;
        self.seeded = false;
        self.round = None;
        Ok(())
    }

    fn draft_round(&mut self, history: &[u32], n: usize, sampling: DraftSampling) -> Result<Chosen, PluginError> {
        self.round = Some(Round { drafts: Vec::new() });
        let nothing = Chosen { drafts: Vec::new(), logits: Vec::new(), q: None };
        if !self.seeded {
            return Ok(nothing);
        }
        let Some(context) = self.pending.take() else { return Ok(nothing) };
        let anchor = *history.last().expect("a history has a token");
        let k = n.min(self.proposals);
        // The block: the anchor then masks; its outputs past the anchor are
        // the drafts, or every slot's with `sample_from_anchor`.
        let masks = if self.shape.sample_from_anchor { k - 1 } else { k };
        let mut ids = vec![anchor];
        ids.extend(std::iter::repeat_n(self.shape.mask_token_id, masks));
        let at = Positions { context: context.first as i32, block: history.len() as i32 - 1 };
        let embeds = self.embed(&ids)?;
        let out = self.net.lock().block.forward(&embeds, &context.taps, at, &mut self.caches).map_err(mlx_error)?;
        let rows = if self.shape.sample_from_anchor { out } else { index_rows(&out, 1, k as i32 + 1)? };
        let logits = self.logits(&rows)?;
        let v = logits.shape()[logits.ndim() - 1];
        let mut logits =
            logits.reshape(&[k as i32, v]).map_err(mlx_error)?.as_dtype(Dtype::Float32).map_err(mlx_error)?;
        if let Some(cap) = self.shape.softcap {
            let c = Array::from_f32(cap);
            logits = ops::tanh(&logits.divide(&c).map_err(mlx_error)?)
                .map_err(mlx_error)?
                .multiply(&c)
                .map_err(mlx_error)?;
        }
        let hidden = rows.reshape(&[k as i32, -1]).map_err(mlx_error)?;
        let mut chosen = self.choose(&logits, &hidden, anchor, k, sampling)?;
        // The confidence head runs only where its values are used (pruning,
        // or the trace): it costs a forward and a host round trip.
        let wanted = !self.shape.thresholds.is_empty() || self.trace.is_some();
        let confidence = if wanted { self.confidences(&rows, anchor, &chosen.drafts, k)? } else { Vec::new() };
        let keep = self.kept(&confidence, chosen.drafts.len());
        if self.trace.is_some() {
            self.trace_rows = (chosen.logits.iter().map(|l| l.as_slice::<f32>().to_vec()).collect(), confidence);
        }
        chosen.drafts.truncate(keep);
        if let Some(q) = chosen.q.take() {
            chosen.q = Some(index_rows(&q, 0, keep as i32)?);
        }
        self.round = Some(Round { drafts: chosen.drafts.clone() });
        Ok(chosen)
    }

    /// The drafts, the logits each was chosen from, and (when sampling)
    /// the distributions they were drawn from: greedy drafts at once, else
    /// one after another (the Markov head sees each draft's predecessor;
    /// draws follow the request's sampling, `Picker`). `hidden` `[k, H]`:
    /// the block's output at each draft's slot (the gated and rnn heads').
    fn choose(
        &self,
        logits: &Array,
        hidden: &Array,
        anchor: u32,
        k: usize,
        sampling: DraftSampling,
    ) -> Result<Chosen, PluginError> {
        let net = self.net.lock();
        // Drafts leave as the verifier's ids (a reduced draft vocabulary
        // chooses among its own).
        let verifier = |t: Array| match &net.draft_vocab {
            Some(dv) => dv.to_verifier(&t).map_err(mlx_error),
            None => Ok(t),
        };
        if net.markov.is_none() && sampling.is_greedy() {
            let tokens = verifier(ops::indexing::argmax_axis(logits, -1, None).map_err(mlx_error)?)?
                .as_dtype(Dtype::Uint32)
                .map_err(mlx_error)?;
            let rows = match self.trace {
                Some(_) => (0..k as i32).map(|i| index_rows(logits, i, i + 1)).collect::<Result<Vec<_>, _>>()?,
                None => Vec::new(),
            };
            mlx_rs::transforms::eval(std::iter::once(&tokens).chain(&rows)).map_err(mlx_error)?;
            return Ok(Chosen { drafts: tokens.as_slice::<u32>().to_vec(), logits: rows, q: None });
        }
        // The chain stays on the device (each draft feeds the next step's
        // Markov correction): one evaluation for the whole block.
        let mut picker = Picker::new(sampling).map_err(mlx_error)?;
        let (mut tokens, mut rows) = (Vec::with_capacity(k), Vec::with_capacity(k));
        let mut previous = Array::from_slice(&[anchor as i32], &[1]);
        let mut state = None;
        for i in 0..k as i32 {
            let row = index_rows(logits, i, i + 1)?;
            let step = match &net.markov {
                Some(m) => m.step(&row, &previous, &index_rows(hidden, i, i + 1)?, &mut state).map_err(mlx_error)?,
                None => row,
            };
            let t = verifier(picker.pick(&step).map_err(mlx_error)?)?.as_dtype(Dtype::Int32).map_err(mlx_error)?;
            previous = t.clone();
            tokens.push(t);
            rows.push(step);
        }
        let tokens = ops::concatenate(&tokens, 0).map_err(mlx_error)?;
        let q = picker.probabilities().map_err(mlx_error)?;
        let q = match (&net.draft_vocab, q) {
            (Some(dv), Some(q)) => Some(dv.spread(&q).map_err(mlx_error)?),
            (_, q) => q,
        };
        mlx_rs::transforms::eval(std::iter::once(&tokens).chain(&rows).chain(&q)).map_err(mlx_error)?;
        let drafts = tokens.as_slice::<i32>().iter().map(|&t| t as u32).collect();
        Ok(Chosen { drafts, logits: rows, q })
    }

    /// The confidence head's estimates (empty without the head).
    fn confidences(&self, rows: &Array, anchor: u32, drafts: &[u32], k: usize) -> Result<Vec<f32>, PluginError> {
        let net = self.net.lock();
        let Some(head) = &net.confidence else { return Ok(Vec::new()) };
        let mut previous = vec![anchor];
        previous.extend(&drafts[..k - 1]);
        let h = rows.reshape(&[k as i32, -1]).map_err(mlx_error)?;
        let c = head.forward(&h, &previous, net.markov.as_ref()).map_err(mlx_error)?;
        mlx_rs::transforms::eval([&c]).map_err(mlx_error)?;
        Ok(c.as_slice::<f32>().to_vec())
    }

    /// Drafts kept: up to the first whose confidence is under its
    /// position's threshold.
    fn kept(&self, confidence: &[f32], drafts: usize) -> usize {
        let t = &self.shape.thresholds;
        if t.is_empty() {
            return drafts;
        }
        confidence.iter().enumerate().position(|(i, &c)| c < t[i.min(t.len() - 1)]).unwrap_or(drafts)
    }

    fn commit_round(&mut self, accepted: usize, states: &TargetStates<'_>) -> Result<(), PluginError> {
        let drafts = self.round.take().map(|r| r.drafts).unwrap_or_default();
        if states.len == 0 || states.taps.len() != self.shape.taps.len() {
            return Err(PluginError::invalid_input("the host lent no hidden taps"));
        }
        let a = accepted.min(drafts.len()).min(states.len as usize - 1);
        let taps = concat_taps(states.taps.as_slice())?;
        self.push_context(states.first as usize, index_rows(&taps, 0, a as i32 + 1)?)?;
        self.seeded = true;
        if self.trace.is_some() && !drafts.is_empty() {
            let (logits, confidence) = std::mem::take(&mut self.trace_rows);
            self.record(
                serde_json::json!({"drafts": drafts, "accepted": a, "logits": logits, "confidence": confidence}),
            );
        }
        Ok(())
    }

    fn record(&mut self, line: serde_json::Value) {
        if let Some(path) = &self.trace {
            if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
                let _ = writeln!(f, "{line}");
            }
        }
    }
}

/// The taps side by side `[1, L, n·H]`, in the order asked (ascending layers).
fn concat_taps(taps: &[TensorRef<'_>]) -> Result<Array, PluginError> {
    let arrays: Vec<Array> = taps.iter().map(|t| into_array(t.to_owned())).collect();
    ops::concatenate(&arrays, -1).map_err(mlx_error)
}

/// Rows `from..to` along the second axis.
fn index_rows(a: &Array, from: i32, to: i32) -> Result<Array, PluginError> {
    use mlx_rs::ops::indexing::IndexOp;
    Ok(if a.ndim() == 2 { a.index((from..to, ..)) } else { a.index((.., from..to, ..)) })
}

impl Drafter for BlockDrafter {
    fn prefill(&mut self, _prompt: RSlice<'_, u32>) -> PResult<()> {
        guard(|| self.reset())
    }

    fn draft(&mut self, args: DraftArgs<'_>) -> PResult<Draft> {
        guard(|| {
            let n = args.max_tokens as usize;
            if n == 0 {
                return Ok(Draft { tokens: RVec::new(), probabilities: ROption::RNone });
            }
            let chosen = self.draft_round(args.history.as_slice(), n, args.sampling)?;
            Ok(Draft { tokens: RVec::from(chosen.drafts), probabilities: chosen.q.map(into_tensor).into() })
        })
    }

    fn commit(&mut self, _accepted: u32) -> PResult<()> {
        // Only reached without states: the context cannot grow, so blocks
        // stop until the next prompt.
        guard(|| {
            self.round = None;
            self.seeded = false;
            Ok(())
        })
    }

    fn target_wants(&self) -> TargetWants {
        TargetWants { hidden: false, taps: RVec::from(self.shape.taps.clone()) }
    }

    fn prefill_states(&mut self, prompt: RSlice<'_, u32>, states: TargetStates<'_>) -> PResult<()> {
        guard(|| {
            self.reset()?;
            let width = crate::config::ceiling(self.shape.width, self.shape.window, prompt.len());
            self.proposals = width.saturating_sub(1).min(self.shape.proposals);
            if states.len > 0 && states.taps.len() == self.shape.taps.len() {
                let taps = concat_taps(states.taps.as_slice())?;
                self.push_context(states.first as usize, taps)?;
            }
            Ok(())
        })
    }

    fn commit_states(&mut self, accepted: u32, states: TargetStates<'_>) -> PResult<()> {
        guard(|| self.commit_round(accepted as usize, &states))
    }
}
