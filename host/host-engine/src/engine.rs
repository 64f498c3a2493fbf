//! A served model: the composed graph + cache layouts (from host-loader),
//! its text side, and the compute dtype chosen for this device.

use crate::runtime::{default_device, DeviceKind};
use crate::tokenizer::TextSide;
use host_loader::{ComposeError, ComposedModel, Registry};
use plugin_api::Dtype;
use std::path::Path;
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Compose(#[from] ComposeError),
    #[error("{0}")]
    Tokenizer(String),
    #[error("{0}")]
    InvalidRequest(String),
    #[error("model: {0}")]
    Model(String),
    #[error("mlx: {0}")]
    Mlx(String),
}

impl From<mlx_rs::error::ConversionError> for EngineError {
    fn from(e: mlx_rs::error::ConversionError) -> Self {
        EngineError::Mlx(e.to_string())
    }
}

impl From<mlx_rs::error::Exception> for EngineError {
    fn from(e: mlx_rs::error::Exception) -> Self {
        EngineError::Mlx(e.what().to_owned())
    }
}

/// What the user asked for: `auto` picks per device, `native` keeps the
/// checkpoint's dtype (and quantization), or a named float dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DtypeChoice {
    Auto,
    Native,
    Fixed(Dtype),
}

impl DtypeChoice {
    pub fn parse(s: &str) -> Result<Self, String> {
        Ok(match s {
            "auto" => Self::Auto,
            "native" => Self::Native,
            "float32" | "f32" => Self::Fixed(Dtype::FLOAT32),
            "bfloat16" | "bf16" => Self::Fixed(Dtype::BFLOAT16),
            "float16" | "f16" => Self::Fixed(Dtype::FLOAT16),
            other => return Err(format!("unknown dtype `{other}` (auto, native, float32, bfloat16, float16)")),
        })
    }
}

pub struct Engine {
    pub model: ComposedModel,
    /// Shared with the HTTP layer (prompt building, detokenizing).
    pub text: Option<Arc<TextSide>>,
    /// The compute dtype asked of the plugins (None = the checkpoint's).
    pub compute_dtype: Option<Dtype>,
    /// The compute dtype in use, and why it was chosen.
    pub dtype_name: String,
    pub dtype_reason: String,
    /// Prompt tokens per prefill chunk (mlx-lm's default: 2048).
    pub prefill_step: usize,
    /// Reusable cache state by token prefix (disabled at capacity 0).
    pub prefix: std::sync::Mutex<crate::prefix_cache::PrefixCache>,
    /// Everything reused state depends on: model, dtype, layouts, tokenizer.
    pub namespace: String,
    /// The drafter for speculative decoding (kind, max depth), if configured.
    pub drafter: Option<std::sync::Mutex<(plugin_api::DrafterBox, String, usize)>>,
    /// Capability tags of the drafter plugin (for resolve_execution).
    pub drafter_caps: Vec<String>,
    /// Opens another instance of the drafter: set for drafters that keep
    /// per-request state (two-model), so each batched row gets its own.
    pub drafter_factory: Option<DrafterFactory>,
    /// KV bytes per token of the drafter's own model (two-model), counted
    /// by memory admission on top of the target's.
    pub draft_kv_bytes_per_token: u64,
    /// Never switch a request to plain steps because rounds do not pay.
    pub speculate_always: bool,
    /// Whether serial greedy rounds are queued before the previous round's
    /// verdict is read (`speculative`).
    pub draft_ahead: DraftAhead,
}

impl Engine {
    pub fn load(registry: &Registry, dir: &Path, choice: DtypeChoice) -> Result<Self, EngineError> {
        let (_, config) = host_loader::compose::read_config(dir)?;
        let quantized = config.get("quantization").is_some() || config.get("quantization_config").is_some();
        let (dtype, reason) = match choice {
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
        let model = registry.open_model(dir, dtype, "plain")?;
        let dtype_name = match dtype {
            Some(d) => d.name().to_owned(),
            None if quantized => {
                format!("{} (quantized {}-bit)", model.plan.weights_dtype.name(), model.plan.quant_bits)
            }
            None => model.plan.weights_dtype.name().to_owned(),
        };
        let text = if dir.join("tokenizer.json").exists() {
            Some(Arc::new(TextSide::load(dir, &model.config).map_err(|e| EngineError::Tokenizer(e.to_string()))?))
        } else {
            None
        };
        let tokenizer_id = std::fs::metadata(dir.join("tokenizer.json")).map(|m| m.len()).unwrap_or(0);
        // Adapters and drafters join the namespace when they exist.
        let namespace = format!(
            "{}|{}|{}|{}|tokenizer:{tokenizer_id}|adapter:none|drafter:none",
            std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf()).display(),
            dtype_name,
            model.scheme,
            model.layouts.join(",")
        );
        Ok(Self {
            model,
            text,
            compute_dtype: dtype,
            dtype_name,
            dtype_reason: reason,
            prefill_step: 2048,
            prefix: std::sync::Mutex::new(crate::prefix_cache::PrefixCache::new(0)),
            namespace,
            drafter: None,
            drafter_caps: Vec::new(),
            drafter_factory: None,
            draft_kv_bytes_per_token: 0,
            speculate_always: false,
            draft_ahead: DraftAhead::Auto,
        })
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
}

impl Engine {
    /// The binding's capabilities for resolve_execution, from the tags the
    /// family and layout plugins advertise (no plugin is named).
    pub fn capabilities(&self) -> crate::plan::Capabilities {
        let tags: Vec<&str> = self.drafter_caps.iter().map(String::as_str).collect();
        let drafter = self.drafter.as_ref().map(|_| tags.as_slice());
        let model: Vec<&str> = self.model.model_caps.iter().map(String::as_str).collect();
        let tags: Vec<Vec<&str>> =
            self.model.layout_caps.iter().map(|(_, t)| t.iter().map(String::as_str).collect()).collect();
        let layouts: Vec<(&str, &[&str])> =
            self.model.layout_caps.iter().zip(&tags).map(|((n, _), t)| (n.as_str(), t.as_slice())).collect();
        let mut caps = crate::plan::Capabilities::from_tags(&model, &layouts, drafter);
        // The batch scheduler runs speculative rows with one history-only
        // drafter or one drafter instance per row (a factory): otherwise a
        // model's `grouped:speculative` cannot be honoured and such requests
        // run serial.
        if !self.batch_speculation() {
            caps.grouped_methods.retain(|m| m != "speculative");
        }
        caps
    }
}

/// When the serial executor drafts ahead (pipelined rounds).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DraftAhead {
    /// When the drafter advertises `caps::DRAFT_AHEAD` (it measured a gain).
    #[default]
    Auto,
    /// Whenever the drafter implements `draft_ahead` (experiments).
    On,
    Off,
}

impl DraftAhead {
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "on" => Ok(Self::On),
            "off" => Ok(Self::Off),
            other => Err(format!("draft-ahead must be auto, on or off, got `{other}`")),
        }
    }
}

/// Opens a fresh drafter instance (see `Engine::drafter_factory`).
pub type DrafterFactory = Box<dyn Fn() -> Result<plugin_api::DrafterBox, String> + Send + Sync>;

impl Engine {
    /// Whether speculative rows can run inside the batch (see `capabilities`).
    pub fn batch_speculation(&self) -> bool {
        self.drafter.is_some() && (self.history_only_drafter() || self.drafter_factory.is_some())
    }

    /// Per layer (cache order): whether its layout rolls back by snapshot
    /// and replay (`caps::SPEC_REPLAY`) rather than by dropping tokens.
    pub fn replay_layers(&self) -> Vec<bool> {
        let replays = |name: &String| {
            self.model
                .layout_caps
                .iter()
                .any(|(n, t)| n == name && t.iter().any(|t| t == plugin_api::caps::SPEC_REPLAY))
        };
        self.model.layouts.iter().map(replays).collect()
    }

    /// One drafter instance can serve every row (`caps::HISTORY_ONLY`);
    /// otherwise each speculating row opens its own (`drafter_factory`).
    pub fn history_only_drafter(&self) -> bool {
        self.drafter_caps.iter().any(|t| t == plugin_api::caps::HISTORY_ONLY)
    }

    /// Installs a drafter. The prefix cache namespace then names it too
    /// (state is only reused under the same drafter).
    pub fn set_drafter(
        &mut self,
        drafter: plugin_api::DrafterBox,
        kind: &str,
        plugin: &str,
        caps: Vec<String>,
        depth: usize,
    ) {
        self.drafter = Some(std::sync::Mutex::new((drafter, kind.to_owned(), depth.max(1))));
        self.drafter_caps = caps;
        self.namespace = self.namespace.replace("drafter:none", &format!("drafter:{plugin}/{kind}"));
    }

    /// The facts of a request as resolve_execution sees them.
    pub fn facts(&self, req: &crate::GenerateRequest) -> crate::plan::RequestFacts {
        let mut f = crate::plan::RequestFacts::of(req);
        f.has_draft = self.drafter.is_some() && req.speculate;
        f.draft_kind = self.drafter.as_ref().and_then(|d| d.lock().ok().map(|g| g.1.clone()));
        f
    }

    /// Enables the prefix cache with this many bytes (0 disables it).
    pub fn set_prefix_cache(&mut self, bytes: usize) {
        self.prefix = std::sync::Mutex::new(crate::prefix_cache::PrefixCache::new(bytes));
    }

    /// Imports the longest cached prefix of `prompt` into fresh `caches`.
    pub fn prefix_take(&self, prompt: &[u32], caches: &mut [plugin_api::CacheBox]) -> usize {
        let fresh = || self.new_caches().ok();
        self.prefix.lock().map(|mut p| p.take(&self.namespace, prompt, caches, &fresh)).unwrap_or(0)
    }

    /// Stores `caches`, which must hold exactly `tokens`.
    pub fn prefix_put(&self, tokens: &[u32], caches: &[plugin_api::CacheBox]) {
        if let Ok(mut p) = self.prefix.lock() {
            p.put(&self.namespace, tokens, caches);
        }
    }

    /// Stores exported 1-row states for `tokens`; `trimmable` as the
    /// layouts they came from report it.
    pub fn prefix_insert(&self, tokens: Vec<u32>, states: Vec<plugin_api::CacheState>, trimmable: bool) {
        if let Ok(mut p) = self.prefix.lock() {
            p.insert(&self.namespace, tokens, states, trimmable);
        }
    }

    /// Stores the end state of a generation: `known` = prompt + emitted
    /// tokens; the caches may hold one token more (a step computed ahead),
    /// which is trimmed first when the layouts can trim.
    pub fn prefix_put_final(&self, known: &[u32], caches: &mut [plugin_api::CacheBox]) {
        if !self.prefix.lock().map(|p| p.enabled()).unwrap_or(false) {
            return;
        }
        let Some(held) = caches.first().map(|c| c.offset() as usize) else { return };
        if held > known.len() {
            let extra = (held - known.len()) as u64;
            if !caches.iter_mut().all(|c| c.is_trimmable() && c.trim(extra) == extra) {
                return;
            }
        }
        let held = caches.first().map(|c| c.offset() as usize).unwrap_or(0);
        self.prefix_put(&known[..held.min(known.len())], caches);
    }

    /// Evicts prefix-cache entries until it holds at most `limit` bytes;
    /// true when something was evicted.
    pub fn prefix_shrink(&self, limit: u64) -> bool {
        let Ok(mut p) = self.prefix.lock() else { return false };
        let before = p.counters.evictions;
        p.shrink_to(limit.min(usize::MAX as u64) as usize);
        p.counters.evictions > before
    }

    pub fn prefix_counters(&self) -> crate::prefix_cache::CacheCounters {
        self.prefix.lock().map(|p| p.counters).unwrap_or_default()
    }
}
