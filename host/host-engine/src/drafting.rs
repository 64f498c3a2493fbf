//! The drafter an engine speculates with: opened once from the
//! configuration (a drafter plugin, or a drafter the embedding program
//! made), with what the host needs to know about it.

use crate::config::{DraftSource, SpeculationConfig};
use crate::error::EngineError;
use crate::target_kv::KvLayer;
use crate::tokenizer::TextSide;
use host_loader::compose::ComposedModel;
use host_loader::services::DrafterFactory;
use host_loader::Registry;
use plugin_api::{caps, DrafterBox, Dtype, TargetWants};
use std::sync::{Arc, Mutex};

/// Tokens per round when neither the user nor the drafter says.
const DEFAULT_DEPTH: usize = 3;

pub struct Drafting {
    /// The instance serial requests and history-only batches use.
    pub shared: Mutex<DrafterBox>,
    /// The draft kind (`ngram`, `two-model`, ...).
    pub kind: String,
    /// The plugin that implements it (`test` for a given drafter).
    pub plugin: String,
    /// Most tokens drafted per round.
    pub depth: usize,
    /// Capability tags of the drafter.
    pub capabilities: Vec<String>,
    /// Opens more instances: set for drafters with per-request state
    /// (two-model), so each batched row gets its own.
    pub factory: Option<DrafterFactory>,
    /// KV bytes per token of the drafter's own model, counted by memory
    /// admission on top of the target's.
    pub kv_bytes_per_token: u64,
    /// Never fall back to plain steps because rounds do not pay.
    pub always: bool,
    /// The target states the drafter reads (none for the plain protocol).
    pub wants: TargetWants,
    /// The target layers whose K/V the drafter reads, resolved.
    pub kv: Vec<KvLayer>,
}

impl Drafting {
    pub fn open(
        registry: &Arc<Registry>,
        target: &Arc<ComposedModel>,
        text: Option<&TextSide>,
        dtype: Option<Dtype>,
        cfg: SpeculationConfig,
    ) -> Result<Self, EngineError> {
        let SpeculationConfig { source, depth, always } = cfg;
        let (kind, draft_model, options) = match source {
            DraftSource::Given { drafter, kind, capabilities } => {
                let depth = depth.unwrap_or(DEFAULT_DEPTH).max(1);
                let wants = drafter.target_wants();
                return Ok(Self {
                    wants,
                    kv: Vec::new(),
                    shared: Mutex::new(drafter),
                    kind,
                    plugin: "test".into(),
                    depth,
                    capabilities,
                    factory: None,
                    kv_bytes_per_token: 0,
                    always,
                });
            }
            DraftSource::Plugin { kind, draft_model, options } => (kind, draft_model, options),
        };
        let kind = match (kind, &draft_model) {
            (Some(k), _) => k,
            (None, Some(dir)) => registry.detect_draft_kind(dir).ok_or_else(|| {
                EngineError::Config(format!("no drafter plugin recognises the draft folder {}", dir.display()))
            })?,
            (None, None) => return Err(EngineError::Config("speculation needs a draft kind or a draft model".into())),
        };
        let capabilities = registry.drafter_capabilities(&kind);
        // Only a drafter with a model of its own has a tokenizer to compare
        // (an MTP head reads through the target's embedding and LM head).
        let own_model = capabilities.iter().any(|t| t == caps::NEEDS_DRAFT_MODEL);
        if let (Some(dir), true) = (&draft_model, own_model) {
            let text = text.ok_or_else(|| {
                EngineError::Config("the target has no tokenizer.json to compare a draft model with".into())
            })?;
            same_tokenizer(text, dir)?;
        }
        let default_depth = capabilities
            .iter()
            .find_map(|t| t.strip_prefix(caps::DEFAULT_DEPTH_PREFIX)?.parse::<usize>().ok())
            .unwrap_or(DEFAULT_DEPTH);
        let depth = depth.unwrap_or(default_depth);
        if !(1..=32).contains(&depth) {
            return Err(EngineError::Config("the draft depth (--num-draft-tokens) must be between 1 and 32".into()));
        }
        let (factory, drafter) = host_loader::services::open_drafter(
            registry,
            &kind,
            draft_model.as_deref(),
            depth as u32,
            &options,
            dtype,
            target.clone(),
        )?;
        let history_only = capabilities.iter().any(|t| t == caps::HISTORY_ONLY);
        let wants = drafter.target_wants();
        if !wants.taps.is_empty() && !target.model_caps.iter().any(|c| c == caps::HIDDEN_TAPS) {
            return Err(EngineError::Config(format!(
                "the `{kind}` drafter reads hidden taps, which the target's family plugin `{}` does not offer",
                target.family_plugin
            )));
        }
        if let Some(bad) = wants.taps.iter().find(|&&t| t as usize >= target_layers(target)) {
            return Err(EngineError::Config(format!(
                "the `{kind}` drafter taps layer {bad}, the target has {} decoder layers",
                target_layers(target)
            )));
        }
        let kv = crate::target_kv::resolve(&kind, &drafter.target_kv(), target)?;
        Ok(Self {
            wants,
            kv,
            shared: Mutex::new(drafter),
            kind,
            plugin: factory.plugin.clone(),
            depth,
            kv_bytes_per_token: factory.cache_bytes_per_token(),
            capabilities,
            // Per-request state: batched rows each open their own instance
            // (a draft model's weights are shared, its caches are not).
            factory: (!history_only).then_some(factory),
            always,
        })
    }

    /// Rounds keep the full depth (`caps::FIXED_DEPTH`).
    pub fn fixed_depth(&self) -> bool {
        self.capabilities.iter().any(|t| t == caps::FIXED_DEPTH)
    }

    /// One drafter instance can serve every row (`caps::HISTORY_ONLY`).
    pub fn history_only(&self) -> bool {
        self.capabilities.iter().any(|t| t == caps::HISTORY_ONLY)
    }

    /// Whether speculative rows can run inside a batch: one instance serves
    /// them all, or the host can open one per row (always, for drafters that
    /// read the target's states: each row's states go to its own instance).
    pub fn batchable(&self) -> bool {
        self.factory.is_some() || (self.history_only() && !self.wants.any() && self.kv.is_empty())
    }

    /// The target states this drafter reads, if any.
    pub fn reads_states(&self) -> Option<&TargetWants> {
        self.wants.any().then_some(&self.wants)
    }

    /// A fresh instance for one batched row (drafters with per-request state).
    pub fn open_instance(&self) -> Result<DrafterBox, EngineError> {
        match &self.factory {
            Some(f) => Ok(f.open()?),
            None => Err(EngineError::Config(format!("the `{}` drafter cannot open more instances", self.kind))),
        }
    }
}

/// Decoder layers of the target, from its config (`num_hidden_layers`, at
/// the top or in `text_config`); the plan's cache layers when absent.
fn target_layers(target: &ComposedModel) -> usize {
    let n = |v: &serde_json::Value| v.get("num_hidden_layers").and_then(serde_json::Value::as_u64);
    n(&target.config)
        .or_else(|| target.config.get("text_config").and_then(n))
        .map_or(target.plan.layers.len(), |n| n as usize)
}

/// The start-up probe: a draft model must tokenize exactly as the target.
fn same_tokenizer(target: &TextSide, dir: &std::path::Path) -> Result<(), EngineError> {
    let path = dir.join("tokenizer.json");
    let draft = tokenizers::Tokenizer::from_file(&path).map_err(|e| {
        EngineError::Config(format!("draft model {}: {e} (its tokenizer must match the target's)", path.display()))
    })?;
    if draft.get_vocab(true) != target.tokenizer.get_vocab(true) {
        return Err(EngineError::Config(format!(
            "the draft model's tokenizer ({}) differs from the target's: speculative decoding needs the same vocabulary",
            path.display()
        )));
    }
    let probe = "The quick brown fox 123 jumps! <|im_start|>";
    let ids = |t: &tokenizers::Tokenizer| t.encode(probe, false).map(|e| e.get_ids().to_vec()).unwrap_or_default();
    if ids(&draft) != ids(&target.tokenizer) {
        return Err(EngineError::Config("the draft model's tokenizer encodes differently from the target's".into()));
    }
    Ok(())
}
