//! Drafter `draft-two-model` (kind `two-model`): a full second model with
//! the target's tokenizer drafts over its own caches: greedily at
//! temperature 0, else by sampling its processed distribution q with the
//! request's parameters and returning q's rows (the host verifies them by
//! rejection sampling). The host opens it with whatever family plugin
//! claims it (`HostServices`), so any family can draft for any other.
//!
//! Cache bookkeeping: before a round the draft caches hold `cached` tokens
//! of the history; a round feeds the rest of the history, then its own
//! drafts d1..d(k-1) (dk is proposed but never fed). `commit(n)` keeps the
//! history plus the accepted drafts it fed and trims the rest.
//!
//! Drafting ahead: a round drafted ahead first feeds the previous round's
//! dk and the target's lazy `pending` token (its `lead`, history once the
//! previous round is fully accepted), then drafts as above, all lazily.
//! Outstanding rounds queue in `rounds`; a commit settles the oldest.
//! Implemented, but `caps::DRAFT_AHEAD` is not advertised: on the H200 it
//! measured no better than rounds one at a time (docs/benchmarks.md), so
//! the host drafts ahead with it only when asked (`--draft-ahead on`).

use plugin_api::abi_stable::sabi_trait::TD_Opaque;
use plugin_api::abi_stable::std_types::{ROption, RSlice, RVec};
use plugin_api::*;
use plugin_sdk::mlx_rs::{self, Array};
use plugin_sdk::{guard, into_array, into_tensor, rstrings};

mod sampling;

plugin_sdk::export_plugin! {
    manifest: manifest,
    detect_draft: detect,
    open_drafter: open,
}

fn manifest() -> PluginManifest {
    plugin_sdk::manifest!(
        PluginKind::DRAFTER,
        "a second model drafting over its own caches (greedy, or sampled with its probabilities)",
        Claims { draft_kinds: rstrings(&["two-model"]), ..Default::default() },
        &[caps::NEEDS_DRAFT_MODEL, caps::DRAFT_PROBABILITIES],
    )
}

/// Any folder with a config.json can be a draft model; the host's kind
/// detection decides first (two-model is its fallback kind).
fn detect(dir: &str, _config: &str) -> u32 {
    u32::from(std::path::Path::new(dir).join("config.json").exists())
}

fn open(args: &DrafterOpenArgs, host: HostServicesBox) -> Result<DrafterBox, PluginError> {
    let dir = args
        .dir
        .as_ref()
        .map(|d| d.to_string())
        .into_option()
        .ok_or_else(|| PluginError::invalid_input("the two-model drafter needs a draft model folder"))?;
    let m = host.open_model(dir.as_str().into()).into_result()?;
    // Rounds roll back by trim; recurrent state cannot (the host's snapshot
    // and replay serves the target only), so refuse at start-up.
    if let Some(c) = m.caches.iter().find(|c| !c.is_trimmable()) {
        return Err(PluginError::unsupported(format!(
            "the draft model's cache layout `{}` cannot trim (recurrent state?): it cannot draft",
            c.signature()
        )));
    }
    Ok(Drafter_TO::from_value(
        TwoModel {
            graph: m.graph,
            caches: m.caches,
            cached: 0,
            rounds: Default::default(),
            last: None,
            depth: args.max_depth.max(1) as usize,
            _host: host,
        },
        TD_Opaque,
    ))
}

struct TwoModel {
    graph: ModelBox,
    caches: RVec<CacheBox>,
    /// History tokens held by the caches.
    cached: usize,
    /// Rounds drafted and not settled yet, oldest first.
    rounds: std::collections::VecDeque<Fed>,
    /// The newest round's last draft (lazy `[1]`): proposed, not fed.
    last: Option<Array>,
    depth: usize,
    /// Keeps the host's services (and the draft model's plugins) alive.
    _host: HostServicesBox,
}

fn tensor_ref(a: &Array) -> TensorRef<'_> {
    unsafe { TensorRef::from_raw(a.as_ptr()) }
}

fn mlx(e: mlx_rs::error::Exception) -> PluginError {
    PluginError::mlx(e.what().to_owned())
}

impl TwoModel {
    /// Runs `tokens` `[1, L]` and returns the logits `[1, V]` of the last position (lazy).
    fn next(&mut self, tokens: &Array) -> Result<Array, PluginError> {
        let args = ForwardArgs {
            tokens: tensor_ref(tokens),
            logits: LogitsMode::LAST,
            want_hidden: false,
            taps: RSlice::from_slice(&[]),
        };
        let out = self.graph.forward(args, self.caches.as_mut_rslice()).into_result()?;
        let logits = match out.logits {
            ROption::RSome(t) => into_array(t),
            ROption::RNone => return Err(PluginError::invalid_input("draft model returned no logits")),
        };
        let v = logits.shape()[logits.ndim() - 1];
        logits.reshape(&[1, v]).map_err(mlx)
    }

    /// Feeds `tokens` `[1, L]` and drafts `n` tokens after them, each
    /// choice feeding the next step lazily (no host sync) and queued on the
    /// device at once (async eval), so the device computes step i while the
    /// host builds step i+1: without it the whole chain was built first and
    /// then run, host and device in turn. Records the round; returns the
    /// drafts (uint32 `[n]`, lazy) and q's rows when sampling.
    fn chain(
        &mut self,
        tokens: &Array,
        n: usize,
        sampling: DraftSampling,
        lead: usize,
    ) -> Result<(Array, Option<Array>), PluginError> {
        let mut picker = sampling::Picker::new(sampling).map_err(mlx)?;
        let mut y = picker.pick(&self.next(tokens)?).map_err(mlx)?;
        mlx_rs::transforms::async_eval([&y]).map_err(mlx)?;
        let mut drafted = vec![y.clone()];
        for _ in 1..n {
            y = picker.pick(&self.next(&y.reshape(&[1, 1]).map_err(mlx)?)?).map_err(mlx)?;
            mlx_rs::transforms::async_eval([&y]).map_err(mlx)?;
            drafted.push(y.clone());
        }
        self.rounds.push_back(Fed { lead, fed: n - 1 });
        self.last = Some(y);
        let all = mlx_rs::ops::concatenate(&drafted, 0).map_err(mlx)?.as_dtype(mlx_rs::Dtype::Uint32).map_err(mlx)?;
        Ok((all, picker.probabilities().map_err(mlx)?))
    }

    /// Forgets every outstanding round: trims what they fed.
    fn void_rounds(&mut self) -> Result<(), PluginError> {
        let fed: usize = self.rounds.drain(..).map(|r| r.lead + r.fed).sum();
        self.last = None;
        self.trim_all(fed as u64)
    }

    fn trim_all(&mut self, n: u64) -> Result<(), PluginError> {
        if n == 0 {
            return Ok(());
        }
        for c in self.caches.iter_mut() {
            if !c.is_trimmable() || c.trim(n) != n {
                return Err(PluginError::unsupported("the draft model's cache layout cannot trim"));
            }
        }
        Ok(())
    }
}

/// What one outstanding round put into the draft caches.
struct Fed {
    /// Tokens fed before its drafts that become history when the round
    /// before it is fully accepted (0 for a round drafted from history).
    lead: usize,
    /// Drafts fed: all it proposed but the last.
    fed: usize,
}

fn ids(tokens: &[u32]) -> Array {
    let v: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
    Array::from_slice(&v, &[1, v.len() as i32])
}

impl Drafter for TwoModel {
    fn prefill(&mut self, prompt: RSlice<'_, u32>) -> PResult<()> {
        guard(|| {
            let held = self.caches.first().map_or(0, |c| c.offset());
            self.trim_all(held)?;
            self.cached = 0;
            self.rounds.clear();
            self.last = None;
            let head = &prompt.as_slice()[..prompt.len().saturating_sub(1)];
            if !head.is_empty() {
                let tokens = ids(head);
                let args = ForwardArgs {
                    tokens: tensor_ref(&tokens),
                    logits: LogitsMode::NONE,
                    want_hidden: true,
                    taps: RSlice::from_slice(&[]),
                };
                let out = self.graph.forward(args, self.caches.as_mut_rslice()).into_result()?;
                if let ROption::RSome(h) = out.hidden {
                    into_array(h).eval().map_err(mlx)?;
                }
                self.cached = head.len();
            }
            Ok(())
        })
    }

    fn draft(&mut self, args: DraftArgs<'_>) -> PResult<Draft> {
        guard(|| {
            let h = args.history.as_slice();
            let n = (args.max_tokens as usize).min(self.depth);
            if n == 0 || h.len() <= self.cached {
                return Ok(Draft { tokens: RVec::new(), probabilities: ROption::RNone });
            }
            // A round not settled by the host is void.
            self.void_rounds()?;
            // Feed the history it has not seen, then its own drafts.
            let tokens = ids(&h[self.cached..]);
            self.cached = h.len();
            let (all, q) = self.chain(&tokens, n, args.sampling, 0)?;
            mlx_rs::transforms::eval(std::iter::once(&all).chain(&q)).map_err(mlx)?;
            Ok(Draft {
                tokens: all.as_slice::<u32>().iter().copied().collect(),
                probabilities: q.map(into_tensor).into(),
            })
        })
    }

    fn draft_ahead(&mut self, args: DraftAheadArgs<'_>) -> PResult<AheadDraft> {
        guard(|| {
            let n = (args.max_tokens as usize).min(self.depth);
            let last = match (&self.last, n) {
                (Some(last), 1..) => last.as_dtype(mlx_rs::Dtype::Int32).map_err(mlx)?.reshape(&[1, 1]).map_err(mlx)?,
                _ => {
                    return Ok(AheadDraft {
                        tokens: into_tensor(Array::from_slice::<i32>(&[], &[0])),
                        probabilities: ROption::RNone,
                    })
                }
            };
            let pending = plugin_sdk::view(args.pending)
                .as_dtype(mlx_rs::Dtype::Int32)
                .map_err(mlx)?
                .reshape(&[1, 1])
                .map_err(mlx)?;
            let lead = mlx_rs::ops::concatenate(&[last, pending], 1).map_err(mlx)?;
            let (all, q) = self.chain(&lead, n, args.sampling, 2)?;
            Ok(AheadDraft {
                tokens: into_tensor(all.as_dtype(mlx_rs::Dtype::Int32).map_err(mlx)?),
                probabilities: q.map(into_tensor).into(),
            })
        })
    }

    fn commit(&mut self, accepted: u32) -> PResult<()> {
        guard(|| {
            let Some(r) = self.rounds.pop_front() else { return Ok(()) };
            if accepted as usize > r.fed {
                // Its fed drafts are history now, and so is the lead of the
                // round drafted behind it.
                self.cached += r.fed;
                if let Some(next) = self.rounds.front_mut() {
                    self.cached += std::mem::take(&mut next.lead);
                }
                if self.rounds.is_empty() {
                    self.last = None;
                }
                return Ok(());
            }
            let keep = (accepted as usize).min(r.fed);
            self.rounds.push_front(Fed { fed: r.fed - keep, ..r });
            self.cached += keep;
            self.void_rounds()
        })
    }
}
