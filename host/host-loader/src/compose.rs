//! Composition by claim and capability: config.json picks the family plugin
//! by the strings it claims; each declared layer need picks a cache-layout
//! plugin that serves that need in the requested scheme. No family or
//! layout is ever named here.
//!
//! A scheme re-encodes stored K/V: a layer whose need no layout serves in
//! the requested scheme (recurrent state holds no K/V) keeps `plain`
//! storage, and `ComposedModel::layer_schemes` says so; a scheme that no
//! layer takes is refused.

use crate::registry::{LoadedPlugin, Registry};
use abi_stable::std_types::{ROption, RStr, RString, Tuple2};
use plugin_api::{
    CacheBox, CacheSpec, Dtype, LayerNeed, ModelBox, ModelOpenArgs, ModelPlan, PResult, PluginError, PluginKind,
};
use serde_json::Value;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum ComposeError {
    #[error("{0}")]
    Config(String),
    #[error("no model-family plugin claims model_type `{model_type}` or architectures {architectures:?} (loaded families claim: {available})")]
    NoFamily { model_type: String, architectures: Vec<String>, available: String },
    #[error("no cache-layout plugin serves `{need}` layers in scheme `{scheme}`{extra}")]
    NoLayout { need: String, scheme: String, extra: String },
    #[error(
        "KV scheme `{scheme}` needs a model family that attends through its cache layouts (`{}`); `{family}` does not",
        plugin_api::caps::LAYOUT_ATTENTION
    )]
    SchemeNeedsLayoutAttention { scheme: String, family: String },
    #[error("KV scheme `{scheme}`: no cache-layout plugin serves any of this model's layers in it (layers: {needs})")]
    SchemeUnused { scheme: String, needs: String },
    #[error("--tp {ranks}: family plugin `{family}` does not advertise `tensor-parallel`")]
    TensorParallelUnsupported { ranks: usize, family: String },
    #[error("--tp {ranks}: the model has {kv_heads} KV heads per layer, which do not divide by {ranks} ranks (KV heads are split, never replicated)")]
    TensorParallelHeads { ranks: usize, kv_heads: u32 },
    #[error("plugin `{plugin}`: {error}")]
    Plugin { plugin: String, error: PluginError },
}

type NewCache = extern "C" fn(&CacheSpec) -> PResult<CacheBox>;

/// A model graph composed with the cache layouts its layers need.
pub struct ComposedModel {
    pub family_plugin: String,
    pub model_type: String,
    pub dir: PathBuf,
    pub config: Value,
    pub graph: ModelBox,
    pub plan: ModelPlan,
    /// The plugin chosen for each layer's cache, and why (for reports).
    pub layouts: Vec<String>,
    pub cache_dtype: Dtype,
    /// The KV scheme asked for (`plain`, `affine8:group=64,start=0`, ...).
    pub scheme: String,
    /// The scheme each layer's cache is made in: `scheme`, or `plain` where
    /// no layout serves that layer's need in it.
    pub layer_schemes: Vec<String>,
    /// Capability tags of the family (manifest and plan) and of each chosen
    /// layout plugin, for resolve_execution.
    pub model_caps: Vec<String>,
    pub layout_caps: Vec<(String, Vec<String>)>,
    factories: Vec<(NewCache, LayerNeed)>,
}

/// Tokens by which a layout's storage grows (written in place between steps).
pub const KV_STEP: u32 = 256;

impl ComposedModel {
    /// Fresh caches for `rows` rows (1 = serial), one per planned layer.
    pub fn new_caches(&self, rows: u32) -> Result<Vec<CacheBox>, ComposeError> {
        self.factories
            .iter()
            .zip(&self.layouts)
            .zip(&self.layer_schemes)
            .map(|(((f, need), plugin), scheme)| {
                let spec = CacheSpec {
                    need: need.clone(),
                    scheme: scheme.as_str().into(),
                    dtype: self.cache_dtype,
                    rows,
                    step: KV_STEP,
                };
                f(&spec).into_result().map_err(|error| ComposeError::Plugin { plugin: plugin.clone(), error })
            })
            .collect()
    }
}

impl ComposedModel {
    /// `plain`, or the scheme and the layers in it, e.g.
    /// `affine8:group=64,start=0 on 2 of 4 layers (the others plain)`.
    pub fn scheme_summary(&self) -> String {
        let on = self.layer_schemes.iter().filter(|s| **s == self.scheme).count();
        match (self.scheme.as_str(), self.layer_schemes.len() - on) {
            ("plain", _) => "plain".to_owned(),
            (s, 0) => format!("{s} on every layer"),
            (s, _) => format!("{s} on {on} of {} layers (the others plain)", self.layer_schemes.len()),
        }
    }
}

/// A scheme's name: `affine8` of `affine8:group=64,start=0`.
pub fn scheme_name(scheme: &str) -> &str {
    scheme.split_once(':').map_or(scheme, |(name, _)| name)
}

/// Reads a model folder's config.json.
pub fn read_config(dir: &Path) -> Result<(String, Value), ComposeError> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| ComposeError::Config(format!("cannot read {}: {e}", path.display())))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| ComposeError::Config(format!("{}: {e}", path.display())))?;
    Ok((text, v))
}

impl Registry {
    /// The family plugin claiming this config: `model_type` first, then
    /// `architectures` entries in order.
    pub fn family_for(&self, config: &Value) -> Result<&LoadedPlugin, ComposeError> {
        let model_type = config.get("model_type").and_then(Value::as_str).unwrap_or("").to_owned();
        let archs: Vec<String> = config
            .get("architectures")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(|x| x.as_str().map(str::to_owned)).collect())
            .unwrap_or_default();
        let families: Vec<&LoadedPlugin> = self.of_kind(PluginKind::MODEL_FAMILY).collect();
        if let Some(p) =
            families.iter().find(|p| p.manifest.claims.model_types.iter().any(|t| t.as_str() == model_type))
        {
            return Ok(p);
        }
        for a in &archs {
            if let Some(p) = families.iter().find(|p| p.manifest.claims.architectures.iter().any(|t| t.as_str() == a)) {
                return Ok(p);
            }
        }
        let available = families
            .iter()
            .map(|p| {
                format!(
                    "{} ({})",
                    p.name(),
                    p.manifest.claims.model_types.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
                )
            })
            .collect::<Vec<_>>()
            .join("; ");
        Err(ComposeError::NoFamily {
            model_type,
            architectures: archs,
            available: if available.is_empty() { "none".into() } else { available },
        })
    }

    /// A cache-layout plugin serving `need` in `scheme` (claimed by its
    /// name, the part before any `:` parameters); with `rows`, one that
    /// also advertises row operations (batching).
    pub fn layout_for(&self, need: &LayerNeed, scheme: &str, rows: bool) -> Result<&LoadedPlugin, ComposeError> {
        let scheme = scheme_name(scheme);
        let serves = |p: &&LoadedPlugin| {
            let c = &p.manifest.claims;
            c.cache_needs.iter().any(|n| n.as_str() == need.kind.as_str())
                && c.cache_schemes.iter().any(|s| s.as_str() == scheme)
        };
        let mut candidates: Vec<&LoadedPlugin> = self.of_kind(PluginKind::CACHE_LAYOUT).filter(serves).collect();
        if rows {
            candidates.retain(|p| p.has_capability(plugin_api::caps::ROWS));
        }
        candidates.first().copied().ok_or_else(|| ComposeError::NoLayout {
            need: need.kind.as_str().to_owned(),
            scheme: scheme.to_owned(),
            extra: if rows { " with row operations (batching)".into() } else { String::new() },
        })
    }

    /// The checks `open_model` makes of the model option
    /// `tensor-parallel=<ranks>` against the family's tag and plan, from
    /// config.json alone: the launcher of `--tp` runs them before it starts
    /// any rank, so a refusal is one line from one process.
    pub fn check_over_ranks(&self, dir: &Path, options: &[(String, String)]) -> Result<(), ComposeError> {
        let (text, config) = read_config(dir)?;
        let family = self.family_for(&config)?;
        let perr = |error: PluginError| ComposeError::Plugin { plugin: family.name().to_owned(), error };
        let plan_fn = family.root.plan_model().ok_or_else(|| perr(PluginError::unsupported("no plan_model entry")))?;
        let mut plan = plan_fn(RStr::from_str(&text)).into_result().map_err(perr)?;
        split_over_ranks(&mut plan, family, options)
    }

    /// Plans (without reading weights), picks layouts, then loads the graph.
    /// `options` (`key=value`) go to the family plugin as they are.
    pub fn open_model(
        &self,
        dir: &Path,
        compute_dtype: Option<Dtype>,
        scheme: &str,
        options: &[(String, String)],
    ) -> Result<ComposedModel, ComposeError> {
        let (text, config) = read_config(dir)?;
        let family = self.family_for(&config)?;
        let perr = |error: PluginError| ComposeError::Plugin { plugin: family.name().to_owned(), error };
        let plan_fn = family.root.plan_model().ok_or_else(|| perr(PluginError::unsupported("no plan_model entry")))?;
        let open_fn = family.root.open_model().ok_or_else(|| perr(PluginError::unsupported("no open_model entry")))?;
        let mut plan = plan_fn(RStr::from_str(&text)).into_result().map_err(perr)?;
        split_over_ranks(&mut plan, family, options)?;
        let mut factories = Vec::new();
        let mut layouts = Vec::new();
        let mut layer_schemes = Vec::new();
        let mut layout_caps: Vec<(String, Vec<String>)> = Vec::new();
        for need in plan.layers.iter() {
            let (p, layer_scheme) = match self.layout_for(need, scheme, false) {
                Ok(p) => (p, scheme),
                Err(ComposeError::NoLayout { .. }) if scheme_name(scheme) != "plain" => {
                    (self.layout_for(need, "plain", false)?, "plain")
                }
                Err(e) => return Err(e),
            };
            layer_schemes.push(layer_scheme.to_owned());
            let f = p.root.new_cache().ok_or_else(|| ComposeError::Plugin {
                plugin: p.name().to_owned(),
                error: PluginError::unsupported("no new_cache entry"),
            })?;
            factories.push((f, need.clone()));
            layouts.push(p.name().to_owned());
            if !layout_caps.iter().any(|(n, _)| n == p.name()) {
                layout_caps
                    .push((p.name().to_owned(), p.manifest.capabilities.iter().map(|c| c.to_string()).collect()));
            }
        }
        // A scheme whose layouts keep K/V only they can read needs a family
        // that lets them attend; one whose layouts hand back plain K/V
        // (`plain-fetch`) works with any family.
        let has = |tags: &[RString], cap: &str| tags.iter().any(|t| t.as_str() == cap);
        let attends = has(&family.manifest.capabilities, plugin_api::caps::LAYOUT_ATTENTION)
            || has(&plan.capabilities, plugin_api::caps::LAYOUT_ATTENTION);
        let all_fetch_plain =
            plan.layers.iter().zip(&layer_schemes).filter(|(_, s)| s.as_str() != "plain").all(|(need, s)| {
                self.layout_for(need, s, false)
                    .is_ok_and(|p| has(&p.manifest.capabilities, plugin_api::caps::PLAIN_FETCH))
            });
        if scheme_name(scheme) != "plain" && !attends && !all_fetch_plain {
            return Err(ComposeError::SchemeNeedsLayoutAttention {
                scheme: scheme.to_owned(),
                family: family.name().to_owned(),
            });
        }
        if scheme_name(scheme) != "plain" && layer_schemes.iter().all(|s| s == "plain") {
            return Err(ComposeError::SchemeUnused {
                scheme: scheme.to_owned(),
                needs: plan.layers.iter().map(|n| n.kind.as_str()).collect::<Vec<_>>().join(", "),
            });
        }
        let args = ModelOpenArgs {
            dir: RString::from(dir.to_string_lossy().as_ref()),
            config_json: RString::from(text),
            compute_dtype: match compute_dtype {
                Some(d) => ROption::RSome(d),
                None => ROption::RNone,
            },
            options: options
                .iter()
                .map(|(k, v)| Tuple2(RString::from(k.as_str()), RString::from(v.as_str())))
                .collect(),
        };
        let graph = open_fn(&args).into_result().map_err(perr)?;
        let cache_dtype = compute_dtype.unwrap_or(plan.weights_dtype);
        let mut model_caps: Vec<String> = family.manifest.capabilities.iter().map(|c| c.to_string()).collect();
        model_caps.extend(
            plan.capabilities
                .iter()
                .map(|c| c.to_string())
                .filter(|c| !family.manifest.capabilities.iter().any(|m| m.as_str() == c)),
        );
        Ok(ComposedModel {
            family_plugin: family.name().to_owned(),
            model_type: config.get("model_type").and_then(Value::as_str).unwrap_or("").to_owned(),
            dir: dir.to_path_buf(),
            config,
            graph,
            plan,
            layouts,
            cache_dtype,
            scheme: scheme.to_owned(),
            layer_schemes,
            model_caps,
            layout_caps,
            factories,
        })
    }
}

/// With the model option `tensor-parallel=<ranks>` (the CLI's `--tp`): the
/// family must advertise `tensor-parallel`, and each cache holds this rank's
/// `kv_heads / ranks` heads. A count that does not divide is refused rather
/// than replicated: replicated KV heads would double each rank's cache and
/// attention for heads another rank also computes.
fn split_over_ranks(
    plan: &mut ModelPlan,
    family: &LoadedPlugin,
    options: &[(String, String)],
) -> Result<(), ComposeError> {
    let ranks = options
        .iter()
        .rev()
        .find(|(k, _)| k == plugin_api::caps::TENSOR_PARALLEL_OPTION)
        .and_then(|(_, v)| v.parse::<usize>().ok())
        .unwrap_or(1);
    if ranks <= 1 {
        return Ok(());
    }
    let tp = plugin_api::caps::TENSOR_PARALLEL;
    let advertised = family.manifest.capabilities.iter().chain(plan.capabilities.iter()).any(|c| c.as_str() == tp);
    if !advertised {
        return Err(ComposeError::TensorParallelUnsupported { ranks, family: family.name().to_owned() });
    }
    for need in plan.layers.iter_mut() {
        if need.kv_heads == 0 {
            continue;
        }
        if !(need.kv_heads as usize).is_multiple_of(ranks) {
            return Err(ComposeError::TensorParallelHeads { ranks, kv_heads: need.kv_heads });
        }
        need.kv_heads /= ranks as u32;
    }
    Ok(())
}
