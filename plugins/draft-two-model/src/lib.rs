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

use plugin_api::abi_stable::sabi_trait::TD_Opaque;
use plugin_api::abi_stable::std_types::{ROption, RSlice, RVec};
use plugin_api::*;
use plugin_sdk::mlx_rs::{self, Array};
use plugin_sdk::{guard, into_array, into_tensor, lend, mlx_error, rstrings};

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
        &[caps::NEEDS_DRAFT_MODEL, caps::DRAFT_PROBABILITIES, "default-depth:3"],
    )
}

/// Any folder with a config.json can be a draft model: the fallback
/// kind, at the lowest confidence (a dedicated kind's plugin wins).
fn detect(dir: &str, _config: &str) -> u32 {
    if std::path::Path::new(dir).join("config.json").exists() {
        detect::ANY_MODEL
    } else {
        0
    }
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
            fed: None,
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
    /// Drafts the outstanding round fed (all it proposed but the last);
    /// None when no round awaits its commit.
    fed: Option<usize>,
    depth: usize,
    /// Keeps the host's services (and the draft model's plugins) alive.
    _host: HostServicesBox,
}

impl TwoModel {
    /// Runs `tokens` `[1, L]` and returns the logits `[1, V]` of the last position (lazy).
    fn next(&mut self, tokens: &Array) -> Result<Array, PluginError> {
        let args = ForwardArgs {
            tokens: lend(tokens),
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
        logits.reshape(&[1, v]).map_err(mlx_error)
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
    ) -> Result<(Array, Option<Array>), PluginError> {
        let mut picker = plugin_sdk::draft_sampling::Picker::new(sampling).map_err(mlx_error)?;
        let mut y = picker.pick(&self.next(tokens)?).map_err(mlx_error)?;
        mlx_rs::transforms::async_eval([&y]).map_err(mlx_error)?;
        let mut drafted = vec![y.clone()];
        for _ in 1..n {
            y = picker.pick(&self.next(&y.reshape(&[1, 1]).map_err(mlx_error)?)?).map_err(mlx_error)?;
            mlx_rs::transforms::async_eval([&y]).map_err(mlx_error)?;
            drafted.push(y.clone());
        }
        self.fed = Some(n - 1);
        let all = mlx_rs::ops::concatenate(&drafted, 0)
            .map_err(mlx_error)?
            .as_dtype(mlx_rs::Dtype::Uint32)
            .map_err(mlx_error)?;
        Ok((all, picker.probabilities().map_err(mlx_error)?))
    }

    /// Forgets the outstanding round: trims what it fed.
    fn void_round(&mut self) -> Result<(), PluginError> {
        let fed = self.fed.take().unwrap_or(0);
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
            self.fed = None;
            let head = &prompt.as_slice()[..prompt.len().saturating_sub(1)];
            if !head.is_empty() {
                let tokens = ids(head);
                let args = ForwardArgs {
                    tokens: lend(&tokens),
                    logits: LogitsMode::NONE,
                    want_hidden: true,
                    taps: RSlice::from_slice(&[]),
                };
                let out = self.graph.forward(args, self.caches.as_mut_rslice()).into_result()?;
                if let ROption::RSome(h) = out.hidden {
                    into_array(h).eval().map_err(mlx_error)?;
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
            self.void_round()?;
            // Feed the history it has not seen, then its own drafts.
            let tokens = ids(&h[self.cached..]);
            self.cached = h.len();
            let (all, q) = self.chain(&tokens, n, args.sampling)?;
            mlx_rs::transforms::eval(std::iter::once(&all).chain(&q)).map_err(mlx_error)?;
            Ok(Draft {
                tokens: all.as_slice::<u32>().iter().copied().collect(),
                probabilities: q.map(into_tensor).into(),
            })
        })
    }

    fn commit(&mut self, accepted: u32) -> PResult<()> {
        guard(|| {
            let Some(fed) = self.fed.take() else { return Ok(()) };
            // The accepted drafts it fed are history now; the rest go.
            let keep = (accepted as usize).min(fed);
            self.cached += keep;
            self.trim_all((fed - keep) as u64)
        })
    }
}
