//! The round loop's drafter side, as mlx-vlm's `_mtp_rounds` keeps it.
//!
//! Row p of the head's cache pairs token p+1 with the target's hidden
//! state at p. `prefill_states` builds the rows of the prompt positions
//! the host ran. A draft needs a seed: the head's output row for the
//! newest position; the first round after the prompt has none, drafts
//! nothing (a plain step, as the reference's prefill yields its first
//! token), and its verify brings the hidden state of the prompt's last
//! position. A round with a seed: d1 from the seed's logits (argmax, or a
//! draw from the request's processed distribution when it samples), then
//! each further draft from a row (previous draft, the head's own output)
//! appended to the cache. At commit with `a` drafts accepted, the appended
//! rows past `min(a, appended)` are trimmed, and rows (draft i, verified
//! hidden i) for the accepted drafts not yet in the cache plus (the emitted
//! token, verified hidden a) are queued; they run at the next `draft`,
//! when the emitted token is the history's last. A kept d1 row was built
//! from the head's own hidden state, not the target's (the reference's
//! rule, kept for parity). Positions the host ran without states (prefix
//! cache, plain steps) leave no rows: drafts then see less context, and
//! the round after such a gap drafts nothing to re-seed.

use crate::head::Head;
use plugin_api::abi_stable::std_types::{ROption, RSlice, RVec};
use plugin_api::*;
use plugin_sdk::draft_sampling::Picker;
use plugin_sdk::mlx_rs::{self, Array};
use plugin_sdk::Locked;
use plugin_sdk::{guard, into_array, into_tensor, lend, mlx_error};
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

/// The head's output row for the newest position and its logits.
struct Seed {
    hidden: Array,
    logits: Array,
}

/// Rows waiting for the emitted token (the history's next last token).
struct Queued {
    /// Accepted drafts paired with verified hidden states (the first rows).
    tokens: Vec<u32>,
    /// `[1, tokens + 1, H]`.
    hidden: Array,
    /// The history length at which the last row's token is known.
    at: usize,
}

/// A round's drafts and, when sampled, the distributions they came from
/// (float32 `[n, V]`).
struct Chosen {
    drafts: Vec<u32>,
    q: Option<Array>,
}

struct Round {
    drafts: Vec<u32>,
    /// Rows this round appended to the cache (one per draft after d1).
    appended: usize,
    history: usize,
}

pub struct Mtp {
    head: Arc<Locked<Head>>,
    caches: Vec<CacheBox>,
    host: HostServicesBox,
    depth: usize,
    seed: Option<Seed>,
    queued: Option<Queued>,
    round: Option<Round>,
    /// Writes each round's draft logits, drafts and accepted count as JSON
    /// lines (the option `trace=<file>`; parity tests read it).
    trace: Option<PathBuf>,
    trace_rows: Vec<Vec<f32>>,
}

impl Mtp {
    pub fn new(
        head: Arc<Locked<Head>>,
        caches: Vec<CacheBox>,
        host: HostServicesBox,
        depth: usize,
        trace: Option<PathBuf>,
    ) -> Self {
        Self { head, caches, host, depth, seed: None, queued: None, round: None, trace, trace_rows: Vec::new() }
    }

    /// Appends rows (tokens, hidden `[1, L, H]`) and returns the head's output.
    fn rows(&mut self, tokens: &[u32], hidden: &Array) -> Result<Array, PluginError> {
        let v: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        self.rows_of(&Array::from_slice(&v, &[1, v.len() as i32]), hidden)
    }

    /// `rows` with the tokens as int32 ids `[1, L]` on the device (a draft
    /// not read back yet).
    fn rows_of(&mut self, ids: &Array, hidden: &Array) -> Result<Array, PluginError> {
        let e = into_array(self.host.target_embed(lend(ids)).into_result()?);
        let hidden = hidden.as_dtype(e.dtype()).map_err(mlx_error)?;
        self.head.lock().forward(&e, &hidden, &mut self.caches).map_err(mlx_error)
    }

    /// The seed from the last output row.
    fn seed_from(&mut self, out: &Array) -> Result<Seed, PluginError> {
        let l = out.shape()[1];
        let hidden = out.index_last(l - 1).map_err(mlx_error)?;
        let logits = into_array(self.host.target_lm_head(lend(&hidden)).into_result()?);
        let v = logits.shape()[logits.ndim() - 1];
        let logits = logits.reshape(&[v]).map_err(mlx_error)?.as_dtype(mlx_rs::Dtype::Float32).map_err(mlx_error)?;
        Ok(Seed { hidden, logits })
    }

    fn trim(&mut self, n: usize) -> Result<(), PluginError> {
        for c in self.caches.iter_mut() {
            if n > 0 && c.trim(n as u64) != n as u64 {
                return Err(PluginError::unsupported("mtp: the head's cache cannot trim"));
            }
        }
        Ok(())
    }

    /// Forgets a round the host never settled.
    fn void_round(&mut self) -> Result<(), PluginError> {
        match self.round.take() {
            Some(r) => self.trim(r.appended),
            None => Ok(()),
        }
    }

    fn record(&mut self, line: serde_json::Value) {
        if let Some(path) = &self.trace {
            if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
                let _ = writeln!(f, "{line}");
            }
        }
    }

    /// A draft `[1]` (lazy) from a seed's logits, as the request samples
    /// (`picker`).
    fn pick(picker: &mut Picker, logits: &Array) -> Result<Array, PluginError> {
        picker.pick(&logits.reshape(&[1, -1]).map_err(mlx_error)?).map_err(mlx_error)
    }

    fn draft_round(&mut self, history: &[u32], n: usize, sampling: DraftSampling) -> Result<Chosen, PluginError> {
        self.void_round()?;
        // The queued rows, now that their last token is known.
        if let Some(q) = self.queued.take() {
            if q.at == history.len() {
                let mut tokens = q.tokens;
                tokens.push(*history.last().expect("a history has a token"));
                let out = self.rows(&tokens, &q.hidden)?;
                self.seed = Some(self.seed_from(&out)?);
            }
        }
        let Some(seed) = self.seed.take() else {
            self.round = Some(Round { drafts: Vec::new(), appended: 0, history: history.len() });
            return Ok(Chosen { drafts: Vec::new(), q: None });
        };
        // The chain stays on the device: each draft feeds the next head
        // step unread, and the drafts are read back once at the end.
        let mut picker = Picker::new(sampling).map_err(mlx_error)?;
        let mut picked = vec![Self::pick(&mut picker, &seed.logits)?];
        let mut logits = vec![seed.logits];
        let mut h = seed.hidden;
        let mut appended = 0;
        while picked.len() < n {
            let last = picked.last().expect("one draft at least");
            let ids = last.as_dtype(mlx_rs::Dtype::Int32).and_then(|t| t.reshape(&[1, 1])).map_err(mlx_error)?;
            let out = self.rows_of(&ids, &h)?;
            appended += 1;
            let s = self.seed_from(&out)?;
            picked.push(Self::pick(&mut picker, &s.logits)?);
            logits.push(s.logits);
            h = s.hidden;
        }
        let all =
            mlx_rs::ops::concatenate(&picked, 0).and_then(|a| a.as_dtype(mlx_rs::Dtype::Uint32)).map_err(mlx_error)?;
        let mut evaluated: Vec<&Array> = vec![&all];
        if self.trace.is_some() {
            evaluated.extend(logits.iter());
        }
        mlx_rs::transforms::eval(evaluated).map_err(mlx_error)?;
        let drafts: Vec<u32> = all.as_slice::<u32>().to_vec();
        if self.trace.is_some() {
            self.trace_rows = logits.iter().map(|l| l.as_slice::<f32>().to_vec()).collect();
        }
        self.round = Some(Round { drafts: drafts.clone(), appended, history: history.len() });
        Ok(Chosen { drafts, q: picker.probabilities().map_err(mlx_error)? })
    }

    fn commit_round(&mut self, accepted: usize, states: &TargetStates<'_>) -> Result<(), PluginError> {
        let Some(round) = self.round.take() else { return Ok(()) };
        let ROption::RSome(verified) = states.hidden else {
            return Err(PluginError::invalid_input("mtp: the host lent no hidden states"));
        };
        let verified = verified.to_owned();
        let a = accepted.min(round.drafts.len()).min(states.len.saturating_sub(1) as usize);
        let keep = a.min(round.appended);
        self.trim(round.appended - keep)?;
        let hidden = into_array(verified).index_range(keep as i32, a as i32 + 1).map_err(mlx_error)?;
        self.queued = Some(Queued { tokens: round.drafts[keep..a].to_vec(), hidden, at: round.history + a + 1 });
        if self.trace.is_some() && !round.drafts.is_empty() {
            let rows = std::mem::take(&mut self.trace_rows);
            self.record(serde_json::json!({"drafts": round.drafts, "accepted": a, "logits": rows}));
        }
        Ok(())
    }
}

/// Slicing along the sequence axis of `[1, L, H]`.
trait Rows {
    fn index_last(&self, i: i32) -> mlx_rs::error::Result<Array>;
    fn index_range(&self, from: i32, to: i32) -> mlx_rs::error::Result<Array>;
}

impl Rows for Array {
    fn index_last(&self, i: i32) -> mlx_rs::error::Result<Array> {
        self.index_range(i, i + 1)
    }
    fn index_range(&self, from: i32, to: i32) -> mlx_rs::error::Result<Array> {
        use mlx_rs::ops::indexing::IndexOp;
        Ok(self.index((.., from..to, ..)))
    }
}

impl Drafter for Mtp {
    fn prefill(&mut self, _prompt: RSlice<'_, u32>) -> PResult<()> {
        // Without states nothing can be built: the first rounds re-seed.
        guard(|| {
            let held = self.caches.first().map_or(0, |c| c.offset()) as usize;
            self.trim(held)?;
            self.seed = None;
            self.queued = None;
            self.round = None;
            Ok(())
        })
    }

    fn draft(&mut self, args: DraftArgs<'_>) -> PResult<Draft> {
        guard(|| {
            let n = (args.max_tokens as usize).min(self.depth);
            if n == 0 {
                return Ok(Draft { tokens: RVec::new(), probabilities: ROption::RNone });
            }
            let chosen = self.draft_round(args.history.as_slice(), n, args.sampling)?;
            Ok(Draft { tokens: RVec::from(chosen.drafts), probabilities: chosen.q.map(into_tensor).into() })
        })
    }

    fn commit(&mut self, _accepted: u32) -> PResult<()> {
        // Only reached without states (a host that lends none): the round's
        // rows cannot be completed, so it is forgotten.
        guard(|| {
            self.void_round()?;
            self.seed = None;
            Ok(())
        })
    }

    fn target_wants(&self) -> TargetWants {
        TargetWants { hidden: true, taps: RVec::new() }
    }

    fn prefill_states(&mut self, prompt: RSlice<'_, u32>, states: TargetStates<'_>) -> PResult<()> {
        guard(|| {
            self.prefill(prompt).into_result()?;
            let (first, len) = (states.first as usize, states.len as usize);
            let ROption::RSome(hidden) = states.hidden else { return Ok(()) };
            if len == 0 || first + len >= prompt.len() {
                return Ok(());
            }
            // Row p: (prompt[p + 1], hidden p).
            let tokens = prompt.as_slice()[first + 1..first + len + 1].to_vec();
            let out = self.rows(&tokens, &hidden.to_owned().into_array())?;
            mlx_rs::transforms::eval([&out]).map_err(mlx_error)?;
            Ok(())
        })
    }

    fn commit_states(&mut self, accepted: u32, states: TargetStates<'_>) -> PResult<()> {
        guard(|| self.commit_round(accepted as usize, &states))
    }
}

trait IntoArray {
    fn into_array(self) -> Array;
}

impl IntoArray for Tensor {
    fn into_array(self) -> Array {
        into_array(self)
    }
}
