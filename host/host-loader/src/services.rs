//! What the host lends a drafter (`HostServices`): other plugins through the
//! host's composition, so a two-model drafter can open its draft model with
//! whatever family plugin claims it, and the target's own embedding and LM
//! head.

use crate::compose::ComposedModel;
use crate::registry::Registry;
use abi_stable::sabi_trait::TD_Opaque;
use abi_stable::std_types::{ROption, RSliceMut, RStr, RString, RVec};
use plugin_api::*;
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// Why a drafter could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum DrafterError {
    #[error("no drafter plugin implements draft kind `{kind}` (loaded kinds: {loaded})")]
    UnknownKind { kind: String, loaded: String },
    #[error("plugin `{0}` has no open_drafter entry")]
    NoEntry(String),
    #[error("drafter `{plugin}`: {error}")]
    Plugin { plugin: String, error: PluginError },
}

pub struct Services {
    pub registry: Arc<Registry>,
    /// The model the drafter drafts for.
    pub target: Arc<ComposedModel>,
    /// The compute dtype the target runs in (drafts run in the same).
    pub dtype: Option<Dtype>,
    /// Models opened for drafters, by folder, shared by every drafter this
    /// host opens: a drafter opened per batched row gets the same weights
    /// and fresh caches of its own.
    pub opened: Arc<Mutex<HashMap<String, Arc<ComposedModel>>>>,
}

/// A graph shared between drafter instances (every ModelGraph method
/// takes `&self`; state lives in the caches each instance owns).
struct SharedGraph(Arc<ComposedModel>);

impl ModelGraph for SharedGraph {
    fn plan(&self) -> ModelPlan {
        self.0.graph.plan()
    }
    fn forward(&self, args: ForwardArgs<'_>, caches: RSliceMut<'_, CacheBox>) -> PResult<ForwardOutput> {
        self.0.graph.forward(args, caches)
    }
    fn embed(&self, tokens: TensorRef<'_>) -> PResult<Tensor> {
        self.0.graph.embed(tokens)
    }
    fn lm_head(&self, hidden: TensorRef<'_>) -> PResult<Tensor> {
        self.0.graph.lm_head(hidden)
    }
}

impl Services {
    fn composed(&self, dir: &str) -> Result<Arc<ComposedModel>, PluginError> {
        let mut opened = self.opened.lock().map_err(|_| PluginError::invalid_input("draft model table poisoned"))?;
        if let Some(m) = opened.get(dir) {
            return Ok(m.clone());
        }
        let m = self
            .registry
            .open_model(Path::new(dir), self.dtype, "plain", &[])
            .map_err(|e| PluginError::invalid_input(format!("opening draft model {dir}: {e}")))?;
        let m = Arc::new(m);
        opened.insert(dir.to_owned(), m.clone());
        Ok(m)
    }
}

impl HostServices for Services {
    fn open_model(&self, dir: RStr<'_>) -> PResult<ModelInstance> {
        let composed = match self.composed(dir.as_str()) {
            Ok(m) => m,
            Err(e) => return PResult::RErr(e),
        };
        let caches = match composed.new_caches(1) {
            Ok(c) => c,
            Err(e) => return PResult::RErr(PluginError::invalid_input(e.to_string())),
        };
        let graph = ModelGraph_TO::from_value(SharedGraph(composed), TD_Opaque);
        PResult::ROk(ModelInstance { graph, caches: caches.into_iter().collect::<RVec<_>>() })
    }

    fn target_embed(&self, tokens: TensorRef<'_>) -> PResult<Tensor> {
        self.target.graph.embed(tokens)
    }

    fn target_lm_head(&self, hidden: TensorRef<'_>) -> PResult<Tensor> {
        self.target.graph.lm_head(hidden)
    }

    fn target_plan(&self) -> PResult<ModelPlan> {
        PResult::ROk(self.target.plan.clone())
    }

    fn target_dir(&self) -> PResult<RString> {
        PResult::ROk(self.target.dir.to_string_lossy().as_ref().into())
    }

    fn new_cache(&self, need: &LayerNeed) -> PResult<CacheBox> {
        let plugin = match self.registry.layout_for(need, "plain", false) {
            Ok(p) => p,
            Err(e) => return PResult::RErr(PluginError::unsupported(e.to_string())),
        };
        let Some(new) = plugin.root.new_cache() else {
            return PResult::RErr(PluginError::unsupported(format!(
                "plugin `{}` has no new_cache entry",
                plugin.name()
            )));
        };
        let spec = CacheSpec {
            need: need.clone(),
            scheme: "plain".into(),
            dtype: self.target.cache_dtype,
            rows: 1,
            step: crate::compose::KV_STEP,
        };
        new(&spec)
    }

    fn target_dtype(&self) -> PResult<plugin_api::Dtype> {
        PResult::ROk(self.target.cache_dtype)
    }
}

/// Opens a drafter of `kind` (the plugin claiming it; if several, the one
/// whose `detect_draft` scores `dir` highest).
pub fn open_drafter(
    registry: &Arc<Registry>,
    kind: &str,
    dir: Option<&Path>,
    depth: u32,
    options: &[(String, String)],
    dtype: Option<Dtype>,
    target: Arc<ComposedModel>,
) -> Result<(DrafterFactory, DrafterBox), DrafterError> {
    let config = dir.and_then(|d| std::fs::read_to_string(d.join("config.json")).ok());
    let mut candidates: Vec<_> = registry
        .drafters_of(kind)
        .map(|p| {
            let score = match (p.root.detect_draft(), dir) {
                (Some(f), Some(d)) => {
                    f(RStr::from_str(&d.to_string_lossy()), RStr::from_str(config.as_deref().unwrap_or("")))
                }
                _ => 0,
            };
            (score, p)
        })
        .collect();
    candidates.sort_by_key(|c| std::cmp::Reverse(c.0));
    let Some((_, plugin)) = candidates.first() else {
        let kinds = registry.draft_kinds();
        let loaded = if kinds.is_empty() { "none".into() } else { kinds.join(", ") };
        return Err(DrafterError::UnknownKind { kind: kind.to_owned(), loaded });
    };
    let open = plugin.root.open_drafter().ok_or_else(|| DrafterError::NoEntry(plugin.name().to_owned()))?;
    let args = DrafterOpenArgs {
        kind: kind.into(),
        dir: match dir {
            Some(d) => ROption::RSome(RString::from(d.to_string_lossy().as_ref())),
            None => ROption::RNone,
        },
        config_json: match config {
            Some(c) => ROption::RSome(c.into()),
            None => ROption::RNone,
        },
        max_depth: depth,
        options: options
            .iter()
            .map(|(k, v)| abi_stable::std_types::Tuple2(RString::from(k.as_str()), RString::from(v.as_str())))
            .collect(),
    };
    let factory = DrafterFactory {
        open,
        args,
        plugin: plugin.name().to_owned(),
        registry: registry.clone(),
        dtype,
        target,
        opened: Arc::default(),
    };
    let drafter = factory.open()?;
    Ok((factory, drafter))
}

/// Opens more drafters like the first one: the batch scheduler gives every
/// speculating row of a drafter with per-request state (two-model) its own
/// instance. Draft models are opened once and shared (`Services::opened`).
type OpenDrafterFn = extern "C" fn(args: &DrafterOpenArgs, host: HostServicesBox) -> PResult<DrafterBox>;

pub struct DrafterFactory {
    open: OpenDrafterFn,
    args: DrafterOpenArgs,
    pub plugin: String,
    registry: Arc<Registry>,
    dtype: Option<Dtype>,
    target: Arc<ComposedModel>,
    opened: Arc<Mutex<HashMap<String, Arc<ComposedModel>>>>,
}

impl DrafterFactory {
    /// KV bytes per token of the draft models opened so far (their caches
    /// grow with every request that drafts, serial or batched).
    pub fn cache_bytes_per_token(&self) -> u64 {
        let Ok(opened) = self.opened.lock() else { return 0 };
        opened
            .values()
            .filter_map(|m| m.new_caches(1).ok())
            .map(|cs| cs.iter().map(|c| c.bytes_per_token()).sum::<u64>())
            .sum()
    }

    pub fn open(&self) -> Result<DrafterBox, DrafterError> {
        let services = Services {
            registry: self.registry.clone(),
            target: self.target.clone(),
            dtype: self.dtype,
            opened: self.opened.clone(),
        };
        (self.open)(&self.args, HostServices_TO::from_value(services, TD_Opaque))
            .into_result()
            .map_err(|error| DrafterError::Plugin { plugin: self.plugin.clone(), error })
    }
}
