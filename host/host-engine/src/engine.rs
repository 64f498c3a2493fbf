//! A served model: the composed graph and cache layouts (from host-loader),
//! its text side, the compute dtype chosen for this device, the prefix
//! cache and the drafter, all fixed when the engine is built from its
//! [`EngineConfig`]. What the engine does with them lives elsewhere: the
//! serial executor (`serial`), continuous batching (`batch`), the worker
//! thread (`worker`). Here: running the graph, and resolving each request's
//! execution plan.

use crate::config::{DtypeChoice, EngineConfig};
use crate::drafting::Drafting;
use crate::error::EngineError;
use crate::plan::{Capabilities, Planner, ResolvedExecution, ServerFeatures};
use crate::pooling::{Pooling, PoolingError};
use crate::prefix_cache::PrefixStore;
use crate::request::GenerateRequest;
use crate::runtime::{default_device, DeviceKind};
use crate::target_states::States;
use crate::tensors::{tensor_array, tensor_ref, token_array};
use crate::tokenizer::TextSide;
use host_loader::{ComposedModel, Registry};
use mlx_rs::Array;
use plugin_api::abi_stable::std_types::{ROption, RSlice};
use plugin_api::{CacheBox, Dtype, ForwardArgs, LogitsMode, TargetWants, Tensor};
use std::path::Path;
use std::sync::Arc;

pub struct Engine {
    model: Arc<ComposedModel>,
    text: Option<Arc<TextSide>>,
    /// The compute dtype asked of the plugins (None = the checkpoint's).
    compute_dtype: Option<Dtype>,
    dtype_name: String,
    dtype_reason: String,
    prefill_step: usize,
    prefix: PrefixStore,
    drafting: Option<Drafting>,
    /// How the folder pools hidden states into embeddings, or why it serves none.
    pooling: Result<Pooling, PoolingError>,
    checkpoint_every: Option<usize>,
    /// Generation checkpoints stored (see [`Engine::checkpoint`]).
    checkpoints: std::sync::atomic::AtomicU64,
    /// An empty cache of a layout that keeps a block pool (`--paged-kv`),
    /// to ask for the pool's counts at any time; None when no layer's
    /// layout has one.
    pool_probe: Option<plugin_api::CacheBox>,
}

impl Engine {
    /// Composes the model in `dir` with the plugins of `registry` and
    /// builds everything `cfg` asks for.
    pub fn load(registry: &Arc<Registry>, dir: &Path, cfg: EngineConfig) -> Result<Self, EngineError> {
        let (_, config) = host_loader::compose::read_config(dir)?;
        let quantized = config.get("quantization").is_some() || config.get("quantization_config").is_some();
        let (dtype, reason) = match cfg.dtype {
            DtypeChoice::Native => (None, "native: the checkpoint's dtype, as asked".to_owned()),
            DtypeChoice::Fixed(d) => (Some(d), format!("{}: as asked", d.name())),
            DtypeChoice::Auto => match default_device() {
                // MLX's CPU kernels have no fast bf16/f16/quantized path here;
                // f32 through OpenBLAS is ~10x faster (docs/benchmarks.md).
                DeviceKind::Cpu => (Some(Dtype::FLOAT32), "float32: fastest on the CPU backend (auto)".to_owned()),
                DeviceKind::Gpu => (
                    None,
                    format!(
                        "native{}: the checkpoint's dtype on the GPU (auto)",
                        if quantized { " (quantized)" } else { "" }
                    ),
                ),
            },
        };
        let model = Arc::new(registry.open_model(dir, dtype, &cfg.kv_scheme, &cfg.model_options)?);
        let dtype_name = match dtype {
            Some(d) => d.name().to_owned(),
            None if quantized => {
                format!("{} (quantized {}-bit)", model.plan.weights_dtype.name(), model.plan.quant_bits)
            }
            None => model.plan.weights_dtype.name().to_owned(),
        };
        let text = if dir.join("tokenizer.json").exists() {
            Some(Arc::new(
                TextSide::load(dir, &model.config, model.plan.vocab_size as usize)
                    .map_err(|e| EngineError::Tokenizer(e.to_string()))?,
            ))
        } else {
            None
        };
        let drafting = match cfg.speculation {
            Some(s) => Some(Drafting::open(registry, &model, text.as_deref(), dtype, s)?),
            None => None,
        };
        let tokenizer_id = std::fs::metadata(dir.join("tokenizer.json")).map(|m| m.len()).unwrap_or(0);
        // Everything reused state depends on: a state is only reused under
        // the same model, dtype, layouts, tokenizer, adapters and drafter.
        let namespace = format!(
            "{}|{}|{}|{}|tokenizer:{tokenizer_id}|adapter:none|drafter:{}",
            std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf()).display(),
            dtype_name,
            model.scheme,
            model.layouts.join(","),
            drafting.as_ref().map_or("none".to_owned(), |d| format!("{}/{}", d.plugin, d.kind)),
        );
        let prefix = match &cfg.ssd_cache {
            Some(ssd) => PrefixStore::with_ssd(namespace, cfg.prefix_cache_bytes, ssd)
                .map_err(|e| EngineError::Config(format!("--ssd-cache {}: {e}", ssd.dir.display())))?,
            None => PrefixStore::new(namespace, cfg.prefix_cache_bytes),
        };
        let engine = Self {
            model,
            text,
            compute_dtype: dtype,
            dtype_name,
            dtype_reason: reason,
            prefill_step: cfg.prefill_step.max(1),
            prefix,
            drafting,
            pooling: Pooling::read(dir),
            checkpoint_every: cfg.generation_checkpoint.filter(|&n| n > 0),
            checkpoints: Default::default(),
            pool_probe: None,
        };
        engine.with_pool_probe()
    }

    fn with_pool_probe(mut self) -> Result<Self, EngineError> {
        let caches = self.model.new_caches(0)?;
        self.pool_probe = caches.into_iter().find(|c| c.pool_usage().is_some());
        Ok(self)
    }

    /// The block size and the bytes per token of the layers whose K/V live
    /// in a block pool, when some do.
    pub fn paged_kv(&self) -> Option<(u64, u64)> {
        let block = self.kv_pool()?.block_tokens as u64;
        let caches = self.new_caches().ok()?;
        let bytes = caches.iter().filter(|c| c.pool_usage().is_some()).map(|c| c.bytes_per_token()).sum();
        Some((block, bytes))
    }

    /// The block pool's counts, when the model's K/V live in one.
    pub fn kv_pool(&self) -> Option<plugin_api::PoolUsage> {
        self.pool_probe.as_ref().and_then(|c| c.pool_usage().into_option())
    }

    pub fn model(&self) -> &ComposedModel {
        &self.model
    }

    /// The tokenizer, chat template and generation defaults, when the model
    /// folder has a tokenizer (shared with the HTTP layer).
    pub fn text(&self) -> Option<&Arc<TextSide>> {
        self.text.as_ref()
    }

    pub fn compute_dtype(&self) -> Option<Dtype> {
        self.compute_dtype
    }

    /// The compute dtype in use, and why it was chosen.
    pub fn dtype_name(&self) -> &str {
        &self.dtype_name
    }

    pub fn dtype_reason(&self) -> &str {
        &self.dtype_reason
    }

    /// Prompt tokens per prefill chunk.
    pub fn prefill_step(&self) -> usize {
        self.prefill_step
    }

    pub fn prefix(&self) -> &PrefixStore {
        &self.prefix
    }

    /// A running request that has generated `generated` tokens is due for a
    /// checkpoint (`--generation-checkpoint`).
    pub(crate) fn checkpoint_due(&self, generated: usize) -> bool {
        self.checkpoint_every.is_some_and(|n| generated > 0 && generated.is_multiple_of(n))
    }

    /// Stores a running request's state for `known` (prompt + generated)
    /// tokens, the first `held` of which its caches hold.
    pub(crate) fn checkpoint(&self, known: &[u32], states: Vec<plugin_api::CacheState>, trimmable: bool) {
        let held = states.first().map(|s| s.offset as usize).unwrap_or(0);
        if held > 0 && held <= known.len() {
            self.prefix.insert(known[..held].to_vec(), states, trimmable);
            self.checkpoints.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// As [`Engine::checkpoint`], from one request's own caches.
    pub(crate) fn checkpoint_caches(&self, known: &[u32], caches: &[plugin_api::CacheBox]) {
        let held = caches.first().map(|c| c.offset() as usize).unwrap_or(0);
        if held > 0 && held <= known.len() {
            self.prefix.put(&known[..held], caches);
            self.checkpoints.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    pub fn checkpoints(&self) -> u64 {
        self.checkpoints.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn drafting(&self) -> Option<&Drafting> {
        self.drafting.as_ref()
    }

    /// How inputs become embeddings (`embed`), or why this folder serves none.
    pub fn pooling(&self) -> &Result<Pooling, PoolingError> {
        &self.pooling
    }

    /// EOS ids of the model (generation_config, config, tokenizer).
    pub fn eos_ids(&self) -> Vec<u32> {
        match &self.text {
            Some(t) => t.eos_ids.clone(),
            None => match self.model.config.get("eos_token_id") {
                Some(serde_json::Value::Number(n)) => n.as_u64().map(|n| vec![n as u32]).unwrap_or_default(),
                Some(serde_json::Value::Array(a)) => a.iter().filter_map(|x| x.as_u64().map(|n| n as u32)).collect(),
                _ => Vec::new(),
            },
        }
    }

    /// KV bytes per token of a fresh one-row cache set, plus the drafter's
    /// own model's (each drafting request holds its own draft caches).
    pub fn kv_bytes_per_token(&self) -> u64 {
        let target = self.new_caches().map(|cs| cs.iter().map(|c| c.bytes_per_token()).sum::<u64>()).unwrap_or(0);
        target + self.drafting.as_ref().map_or(0, |d| d.kv_bytes_per_token)
    }
}

/// Execution plans.
impl Engine {
    /// The binding's capabilities for resolve_execution, from the tags the
    /// family, layout and drafter plugins advertise (no plugin is named).
    pub fn capabilities(&self) -> Capabilities {
        let drafter_tags: Vec<&str> =
            self.drafting.iter().flat_map(|d| d.capabilities.iter()).map(String::as_str).collect();
        let drafter = self.drafting.as_ref().map(|_| drafter_tags.as_slice());
        let model: Vec<&str> = self.model.model_caps.iter().map(String::as_str).collect();
        let tags: Vec<Vec<&str>> =
            self.model.layout_caps.iter().map(|(_, t)| t.iter().map(String::as_str).collect()).collect();
        let layouts: Vec<(&str, &[&str])> =
            self.model.layout_caps.iter().zip(&tags).map(|((n, _), t)| (n.as_str(), t.as_slice())).collect();
        let mut caps = Capabilities::from_tags(&model, &layouts, drafter);
        // The batch scheduler runs speculative rows with one history-only
        // drafter or one drafter instance per row: otherwise a model's
        // `grouped:speculative` cannot be honoured and such requests run serial.
        if !self.drafting.as_ref().is_some_and(Drafting::batchable) {
            caps.grouped_methods.retain(|m| m != "speculative");
        }
        caps
    }

    /// What this engine offers every request, with `batch_limit` rows per
    /// batch (1: strictly serial).
    pub fn features(&self, batch_limit: usize) -> ServerFeatures {
        ServerFeatures {
            batch_limit,
            prompt_cache: self.prefix.enabled(),
            speculation_enabled: self.drafting.is_some(),
            compiled_decode: false,
        }
    }

    /// What every plan on this engine with `batch_limit` rows per batch
    /// depends on besides the request.
    pub fn planner(&self, batch_limit: usize) -> Planner {
        Planner {
            capabilities: self.capabilities(),
            features: self.features(batch_limit),
            draft_kind: self.drafting.as_ref().map(|d| d.kind.clone()),
            kv_quant: Some(self.model.scheme.clone()).filter(|s| s != "plain"),
        }
    }

    /// How `req` runs on this engine with `batch_limit` rows per batch:
    /// resolved once, carried with the job, obeyed by every executor.
    pub fn plan(&self, req: &GenerateRequest, batch_limit: usize) -> ResolvedExecution {
        self.planner(batch_limit).plan(req)
    }

    /// Whether every layer's layout lets speculative rounds overlap
    /// (`caps::SPEC_PIPELINE`), so a serial round may be queued before the
    /// previous one's verdict is read. Only in the plain scheme: quantized
    /// K/V turn into codes between rounds (kv-quant), which overlapping
    /// rounds would postpone, so their rounds run one after another.
    pub fn pipelines_rounds(&self) -> bool {
        self.model.scheme == "plain" && self.layers_with(plugin_api::caps::SPEC_PIPELINE).all(|has| has)
    }

    /// Per layer (cache order): whether its layout rolls back by snapshot
    /// and replay (`caps::SPEC_REPLAY`) rather than by dropping tokens.
    pub fn replay_layers(&self) -> Vec<bool> {
        self.layers_with(plugin_api::caps::SPEC_REPLAY).collect()
    }

    /// Per layer (cache order): whether its layout advertises `cap`.
    fn layers_with<'a>(&'a self, cap: &'a str) -> impl Iterator<Item = bool> + 'a {
        self.model
            .layouts
            .iter()
            .map(move |name| self.model.layout_caps.iter().any(|(n, t)| n == name && t.iter().any(|t| t == cap)))
    }
}

/// Running the graph.
impl Engine {
    /// Fresh serial caches for one request.
    pub fn new_caches(&self) -> Result<Vec<CacheBox>, EngineError> {
        Ok(self.model.new_caches(1)?)
    }

    /// Runs the graph over `tokens` `[B, L]`; returns `[B, V]` last logits
    /// when asked, else the final hidden state (to evaluate the caches).
    pub(crate) fn forward(&self, tokens: &Array, caches: &mut [CacheBox], logits: bool) -> Result<Array, EngineError> {
        let mode = if logits { LogitsMode::LAST } else { LogitsMode::NONE };
        let out = self.run_graph(tokens, caches, mode, !logits, &[])?;
        if logits {
            logit_rows(out.logits)
        } else {
            take(out.hidden, "hidden state")
        }
    }

    /// Logits `[B * L, V]` at every position of `tokens` `[B, L]`
    /// (speculative verification).
    pub(crate) fn forward_all(&self, tokens: &Array, caches: &mut [CacheBox]) -> Result<Array, EngineError> {
        logit_rows(self.run_graph(tokens, caches, LogitsMode::ALL, false, &[])?.logits)
    }

    /// `forward_all`, also returning the states a drafter wants at these
    /// positions (`first` = the position of the first token).
    pub(crate) fn forward_all_states(
        &self,
        tokens: &Array,
        caches: &mut [CacheBox],
        wants: &TargetWants,
        first: u64,
    ) -> Result<(Array, States), EngineError> {
        let mut out = self.run_graph(tokens, caches, LogitsMode::ALL, wants.hidden, &wants.taps)?;
        let states = States::take(&mut out, wants, first, tokens.shape()[1] as u64)?;
        Ok((logit_rows(out.logits)?, states))
    }

    /// `prefill`, keeping the states a drafter wants over these positions
    /// (`first` = the position of `tokens[0]`).
    pub(crate) fn prefill_states(
        &self,
        tokens: &[u32],
        caches: &mut [CacheBox],
        wants: &TargetWants,
        first: u64,
    ) -> Result<States, EngineError> {
        let mut states = States { first, ..Default::default() };
        let mut at = first;
        for chunk in tokens.chunks(self.prefill_step) {
            // The hidden state is asked for either way: evaluating it
            // evaluates the caches (`prefill_chunk`).
            let mut out = self.run_graph(&token_array(chunk), caches, LogitsMode::NONE, true, &wants.taps)?;
            let h = take(std::mem::replace(&mut out.hidden, ROption::RNone), "hidden state")?;
            let mut next =
                States::take(&mut out, &TargetWants { hidden: false, ..wants.clone() }, at, chunk.len() as u64)?;
            mlx_rs::transforms::eval(std::iter::once(&h).chain(next.taps.iter()))?;
            next.hidden = wants.hidden.then_some(h);
            states.extend(next)?;
            at += chunk.len() as u64;
        }
        Ok(states)
    }

    /// One call of the family's graph.
    fn run_graph(
        &self,
        tokens: &Array,
        caches: &mut [CacheBox],
        logits: LogitsMode,
        want_hidden: bool,
        taps: &[u32],
    ) -> Result<plugin_api::ForwardOutput, EngineError> {
        let args = ForwardArgs { tokens: tensor_ref(tokens), logits, want_hidden, taps: RSlice::from_slice(taps) };
        self.model.graph.forward(args, caches.into()).into_result().map_err(|e| EngineError::Model(e.to_string()))
    }

    /// Prefills `tokens` into `caches` in chunks, evaluating each chunk.
    pub fn prefill(&self, tokens: &[u32], caches: &mut [CacheBox]) -> Result<(), EngineError> {
        let chunks = tokens.len().div_ceil(self.prefill_step);
        for chunk in tokens.chunks(self.prefill_step) {
            self.prefill_chunk(&token_array(chunk), caches)?;
            if chunks > 1 {
                // As mlx-lm between prefill chunks: a chunk's activations go
                // back before the next one allocates its own.
                crate::runtime::clear_cache();
            }
        }
        Ok(())
    }

    /// Runs `tokens` `[B, L]` into `caches` and evaluates the final hidden
    /// state (which evaluates the caches). Evaluating the exported cache
    /// states instead, as mlx-lm does, would skip work nothing stored needs
    /// (KV-shared layers, the last MLP), but on the H200 it made a 40-token
    /// prefill ~8x slower through the HTTP server (TTFT 489 vs 57 ms,
    /// docs/benchmarks.md; the cause is not isolated yet).
    pub(crate) fn prefill_chunk(&self, tokens: &Array, caches: &mut [CacheBox]) -> Result<(), EngineError> {
        let t0 = std::time::Instant::now();
        let h = self.forward(tokens, caches, false)?;
        let t1 = std::time::Instant::now();
        h.eval()?;
        tracing::trace!(
            target: "host_engine::step",
            tokens = tokens.size(),
            graph_ms = (t1 - t0).as_secs_f64() * 1e3,
            eval_ms = t1.elapsed().as_secs_f64() * 1e3,
            "prefill chunk"
        );
        Ok(())
    }

    /// Last-position logits of a full forward over `prompt` with fresh caches
    /// (float32 copy), for parity checks against the oracle.
    pub fn prompt_logits(&self, prompt: &[u32]) -> Result<Vec<f32>, EngineError> {
        let mut caches = self.new_caches()?;
        let l = self.forward(&token_array(prompt), &mut caches, true)?.as_dtype(mlx_rs::Dtype::Float32)?;
        l.eval()?;
        Ok(l.as_slice::<f32>().to_vec())
    }

    /// The next-token log-probabilities (float32 `[n, V]`) at every position
    /// of `tokens`, run through fresh caches `chunk` tokens per forward;
    /// `each(first position, rows)` sees one chunk's rows at a time.
    pub fn next_token_logprobs(
        &self,
        tokens: &[u32],
        chunk: usize,
        mut each: impl FnMut(usize, &Array) -> Result<(), EngineError>,
    ) -> Result<(), EngineError> {
        let mut caches = self.new_caches()?;
        for (i, c) in tokens.chunks(chunk.max(1)).enumerate() {
            let logits = self.forward_all(&token_array(c), &mut caches)?.as_dtype(mlx_rs::Dtype::Float32)?;
            let lp = logits.subtract(mlx_rs::ops::logsumexp_axis(&logits, -1, true)?)?;
            lp.eval()?;
            each(i * chunk.max(1), &lp)?;
        }
        Ok(())
    }

    /// What every request must be, serial or batched: a prompt of ids in
    /// the vocabulary, and valid sampling parameters.
    pub(crate) fn check_request(&self, req: &GenerateRequest) -> Result<(), EngineError> {
        if req.prompt.is_empty() {
            return Err(EngineError::InvalidRequest("the prompt is empty".into()));
        }
        req.params.validate().map_err(|e| EngineError::InvalidRequest(e.message))?;
        let vocab = self.model.plan.vocab_size;
        if let Some(bad) = req.prompt.iter().find(|&&t| t >= vocab) {
            return Err(EngineError::InvalidRequest(format!(
                "token id {bad} is outside the vocabulary (size {vocab})"
            )));
        }
        Ok(())
    }

    /// Snapshot-and-replay rollback (`caps::SPEC_REPLAY`): a layout that
    /// cannot trim (recurrent state) restores the state it had at the
    /// round's start instead of keeping `kept` tokens. Then every layout is
    /// brought back to the round's start and the kept tokens run through
    /// the model again, so all layers agree on what the cache holds.
    pub(crate) fn replay_if_restored(
        &self,
        starts: &[u64],
        kept: &[u32],
        caches: &mut [CacheBox],
    ) -> Result<bool, EngineError> {
        let n = kept.len() as u64;
        if caches.iter().zip(starts).all(|(c, &s)| c.offset() == s + n) {
            return Ok(false);
        }
        for (c, &s) in caches.iter_mut().zip(starts) {
            let extra = c.offset().saturating_sub(s);
            if extra > 0 && c.trim(extra) != extra {
                return Err(EngineError::Model(format!(
                    "rollback: a layout holds {extra} tokens past the round's start and cannot trim them (signature {})",
                    c.signature()
                )));
            }
        }
        self.forward(&token_array(kept), caches, false)?.eval()?;
        Ok(true)
    }
}

fn take(t: ROption<Tensor>, what: &str) -> Result<Array, EngineError> {
    match t {
        ROption::RSome(t) => Ok(tensor_array(t)),
        ROption::RNone => Err(EngineError::Model(format!("forward returned no {what}"))),
    }
}

/// The graph's logits as rows `[N, V]`.
fn logit_rows(logits: ROption<Tensor>) -> Result<Array, EngineError> {
    let l = take(logits, "logits")?;
    let v = l.shape()[l.ndim() - 1];
    Ok(l.reshape(&[-1, v])?)
}
