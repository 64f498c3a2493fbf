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
//!
//! Pipelined rounds (`draft_ahead`): while a verify is on the device, the
//! next round is drafted as if that verify accepts every draft: the rows
//! its commit would queue run at once with the verify's bonus token,
//! unread, and the chain continues from them. The commit that follows
//! either adopts that round (every draft accepted) or trims its rows and
//! settles as usual.

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
    /// Accepted drafts paired with verified hidden states (the first rows),
    /// uint32 `[n]`; None when there are none.
    tokens: Option<Array>,
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

/// A drafted round awaiting its verdict.
struct Round {
    /// uint32 `[count]`, on the device until someone reads it.
    drafts: Array,
    count: usize,
    /// Rows this round appended to the cache (one per draft after d1).
    appended: usize,
    history: usize,
    /// Each draft step's logits, kept for the trace only.
    logits: Vec<Array>,
}

impl Round {
    /// What settling this round with `a` drafts accepted leaves: the rows
    /// to queue (the accepted drafts not yet in the cache, with `verified`,
    /// the verify's hidden states, from the first of them to position `a`)
    /// and how many of the rows it appended stay.
    fn settled(&self, a: usize, verified: Array) -> Result<(Queued, usize), PluginError> {
        let keep = a.min(self.appended);
        let hidden = verified.index_range(keep as i32, a as i32 + 1).map_err(mlx_error)?;
        let tokens = (keep < a).then(|| self.drafts.index_range_1d(keep as i32, a as i32));
        Ok((Queued { tokens, hidden, at: self.history + a + 1 }, keep))
    }
}

/// A round drafted ahead of the current round's verdict.
struct Ahead {
    round: Round,
    /// Every row `draft_ahead` appended (the queued rows, then the chain's).
    rows: usize,
}

/// What a chain of draft steps left: the drafts (uint32 `[n]`, unread), each
/// step's logits, the rows appended, the sampler (for its q rows).
struct Chain {
    drafts: Array,
    logits: Vec<Array>,
    appended: usize,
    picker: Picker,
}

pub struct Mtp {
    head: Arc<Locked<Head>>,
    caches: Vec<CacheBox>,
    host: HostServicesBox,
    depth: usize,
    seed: Option<Seed>,
    queued: Option<Queued>,
    round: Option<Round>,
    ahead: Option<Ahead>,
    /// Writes each round's draft logits, drafts and accepted count as JSON
    /// lines (the option `trace=<file>`; parity tests read it).
    trace: Option<PathBuf>,
}

impl Mtp {
    pub fn new(
        head: Arc<Locked<Head>>,
        caches: Vec<CacheBox>,
        host: HostServicesBox,
        depth: usize,
        trace: Option<PathBuf>,
    ) -> Self {
        Self { head, caches, host, depth, seed: None, queued: None, round: None, ahead: None, trace }
    }

    /// Appends rows (int32 ids `[1, L]`, hidden `[1, L, H]`; the ids may
    /// still be on the device) and returns the head's output.
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

    /// The queued rows with their last token (`last`, uint32 `[1]`), run:
    /// the seed of the next round, and the rows appended.
    fn run_queued(&mut self, q: Queued, last: &Array) -> Result<(Seed, usize), PluginError> {
        let ids = match &q.tokens {
            Some(t) => mlx_rs::ops::concatenate(&[t, last], 0).map_err(mlx_error)?,
            None => last.clone(),
        };
        let n = ids.shape()[0];
        let ids = ids.as_dtype(mlx_rs::Dtype::Int32).and_then(|t| t.reshape(&[1, n])).map_err(mlx_error)?;
        let out = self.rows_of(&ids, &q.hidden)?;
        Ok((self.seed_from(&out)?, n as usize))
    }

    fn trim(&mut self, n: usize) -> Result<(), PluginError> {
        for c in self.caches.iter_mut() {
            if n > 0 && c.trim(n as u64) != n as u64 {
                return Err(PluginError::unsupported("mtp: the head's cache cannot trim"));
            }
        }
        Ok(())
    }

    /// Forgets rounds the host never settled.
    fn void_round(&mut self) -> Result<(), PluginError> {
        if let Some(a) = self.ahead.take() {
            self.trim(a.rows)?;
        }
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

    /// `n` drafts from `seed`, on the device: each draft feeds the next head
    /// step unread.
    fn chain(&mut self, seed: Seed, n: usize, sampling: DraftSampling) -> Result<Chain, PluginError> {
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
        let drafts =
            mlx_rs::ops::concatenate(&picked, 0).and_then(|a| a.as_dtype(mlx_rs::Dtype::Uint32)).map_err(mlx_error)?;
        if self.trace.is_none() {
            logits.clear();
        }
        Ok(Chain { drafts, logits, appended, picker })
    }

    fn draft_round(&mut self, history: &[u32], n: usize, sampling: DraftSampling) -> Result<Chosen, PluginError> {
        self.void_round()?;
        // The queued rows, now that their last token is known.
        if let Some(q) = self.queued.take() {
            if q.at == history.len() {
                let last = Array::from_slice(&[*history.last().expect("a history has a token")], &[1]);
                self.seed = Some(self.run_queued(q, &last)?.0);
            }
        }
        let Some(seed) = self.seed.take() else {
            let none = Array::from_slice::<u32>(&[], &[0]);
            self.round =
                Some(Round { drafts: none, count: 0, appended: 0, history: history.len(), logits: Vec::new() });
            return Ok(Chosen { drafts: Vec::new(), q: None });
        };
        let chain = self.chain(seed, n, sampling)?;
        let mut evaluated: Vec<&Array> = vec![&chain.drafts];
        evaluated.extend(chain.logits.iter());
        mlx_rs::transforms::eval(evaluated).map_err(mlx_error)?;
        let drafts: Vec<u32> = chain.drafts.as_slice::<u32>().to_vec();
        let q = chain.picker.probabilities().map_err(mlx_error)?;
        self.round = Some(Round {
            drafts: chain.drafts,
            count: drafts.len(),
            appended: chain.appended,
            history: history.len(),
            logits: chain.logits,
        });
        Ok(Chosen { drafts, q })
    }

    /// The round after the current one, as if its verify (`states`, bonus
    /// token `pending`) accepts every draft: the rows that commit would
    /// queue run now, and `n` drafts chain from them. None: nothing changed.
    fn draft_ahead(
        &mut self,
        pending: &Array,
        n: usize,
        states: &TargetStates<'_>,
    ) -> Result<Option<Array>, PluginError> {
        let (Some(round), None, ROption::RSome(verified)) = (self.round.as_ref(), &self.ahead, &states.hidden) else {
            return Ok(None);
        };
        let k = round.count;
        if n == 0 || (states.len as usize) < k + 1 {
            return Ok(None);
        }
        let (queued, _) = round.settled(k, verified.to_owned().into_array())?;
        let history = queued.at;
        let (seed, rows) = self.run_queued(queued, pending)?;
        let chain = self.chain(seed, n, DraftSampling::GREEDY)?;
        let drafts = chain.drafts.clone();
        let round = Round { drafts: chain.drafts, count: n, appended: chain.appended, history, logits: chain.logits };
        self.ahead = Some(Ahead { round, rows: rows + chain.appended });
        Ok(Some(drafts))
    }

    fn commit_round(&mut self, accepted: usize, states: &TargetStates<'_>) -> Result<(), PluginError> {
        let Some(round) = self.round.take() else { return Ok(()) };
        let ROption::RSome(verified) = states.hidden else {
            return Err(PluginError::invalid_input("mtp: the host lent no hidden states"));
        };
        let verified = verified.to_owned();
        let a = accepted.min(round.count).min(states.len.saturating_sub(1) as usize);
        self.record_round(&round, a)?;
        if let Some(ahead) = self.ahead.take() {
            if a == round.count {
                // The round drafted ahead assumed exactly this.
                self.round = Some(ahead.round);
                return Ok(());
            }
            self.trim(ahead.rows)?;
        }
        let (queued, keep) = round.settled(a, into_array(verified))?;
        self.trim(round.appended - keep)?;
        self.queued = Some(queued);
        Ok(())
    }

    /// The trace line of a settled round (its logits read here when it was
    /// drafted ahead).
    fn record_round(&mut self, round: &Round, accepted: usize) -> Result<(), PluginError> {
        if self.trace.is_none() || round.count == 0 {
            return Ok(());
        }
        let mut evaluated: Vec<&Array> = vec![&round.drafts];
        evaluated.extend(round.logits.iter());
        mlx_rs::transforms::eval(evaluated).map_err(mlx_error)?;
        let rows: Vec<Vec<f32>> = round.logits.iter().map(|l| l.as_slice::<f32>().to_vec()).collect();
        let drafts = round.drafts.as_slice::<u32>().to_vec();
        self.record(serde_json::json!({"drafts": drafts, "accepted": accepted, "logits": rows}));
        Ok(())
    }
}

/// Slicing along the sequence axis of `[1, L, H]`.
trait Rows {
    fn index_last(&self, i: i32) -> mlx_rs::error::Result<Array>;
    fn index_range(&self, from: i32, to: i32) -> mlx_rs::error::Result<Array>;
    /// Elements `from..to` of a 1-d array.
    fn index_range_1d(&self, from: i32, to: i32) -> Array;
}

impl Rows for Array {
    fn index_last(&self, i: i32) -> mlx_rs::error::Result<Array> {
        self.index_range(i, i + 1)
    }
    fn index_range(&self, from: i32, to: i32) -> mlx_rs::error::Result<Array> {
        use mlx_rs::ops::indexing::IndexOp;
        Ok(self.index((.., from..to, ..)))
    }
    fn index_range_1d(&self, from: i32, to: i32) -> Array {
        use mlx_rs::ops::indexing::IndexOp;
        self.index(from..to)
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
            self.ahead = None;
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
            let tokens: Vec<i32> = prompt.as_slice()[first + 1..first + len + 1].iter().map(|&t| t as i32).collect();
            let ids = Array::from_slice(&tokens, &[1, tokens.len() as i32]);
            let out = self.rows_of(&ids, &hidden.to_owned().into_array())?;
            mlx_rs::transforms::eval([&out]).map_err(mlx_error)?;
            Ok(())
        })
    }

    fn commit_states(&mut self, accepted: u32, states: TargetStates<'_>) -> PResult<()> {
        guard(|| self.commit_round(accepted as usize, &states))
    }

    fn draft_ahead(&mut self, args: AheadArgs<'_>) -> PResult<ROption<Tensor>> {
        guard(|| {
            if !args.sampling.is_greedy() {
                return Ok(ROption::RNone);
            }
            let n = (args.max_tokens as usize).min(self.depth);
            let pending = args.pending.to_owned().into_array();
            let held = self.caches.first().map_or(0, |c| c.offset()) as usize;
            match self.draft_ahead(&pending, n, &args.states) {
                Ok(drafts) => Ok(drafts.map(into_tensor).into()),
                Err(e) => {
                    // Leave the cache as the round being verified left it.
                    let now = self.caches.first().map_or(0, |c| c.offset()) as usize;
                    self.trim(now.saturating_sub(held))?;
                    Err(e)
                }
            }
        })
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
