//! What the host lends a drafter (`HostServices`): other plugins through the
//! host's composition, so a two-model drafter can open its draft model with
//! whatever family plugin claims it.

use crate::registry::Registry;
use abi_stable::sabi_trait::TD_Opaque;
use abi_stable::std_types::{ROption, RStr, RString, RVec};
use plugin_api::*;
use std::path::Path;
use std::sync::Arc;

pub struct Services {
    pub registry: Arc<Registry>,
    /// The compute dtype the target runs in (drafts run in the same).
    pub dtype: Option<Dtype>,
}

impl HostServices for Services {
    fn open_model(&self, dir: RStr<'_>) -> PResult<ModelInstance> {
        let composed = match self.registry.open_model(Path::new(dir.as_str()), self.dtype, "plain") {
            Ok(m) => m,
            Err(e) => return PResult::RErr(PluginError::invalid_input(format!("opening draft model {dir}: {e}"))),
        };
        let caches = match composed.new_caches(1) {
            Ok(c) => c,
            Err(e) => return PResult::RErr(PluginError::invalid_input(e.to_string())),
        };
        PResult::ROk(ModelInstance { graph: composed.graph, caches: caches.into_iter().collect::<RVec<_>>() })
    }

    fn target_embed(&self, _tokens: TensorRef<'_>) -> PResult<Tensor> {
        PResult::RErr(PluginError::unsupported("this host does not lend the target's embeddings yet"))
    }

    fn target_lm_head(&self, _hidden: TensorRef<'_>) -> PResult<Tensor> {
        PResult::RErr(PluginError::unsupported("this host does not lend the target's LM head yet"))
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
) -> Result<(String, DrafterBox), String> {
    let config = dir.and_then(|d| std::fs::read_to_string(d.join("config.json")).ok());
    let mut candidates: Vec<_> = registry
        .of_kind(PluginKind::DRAFTER)
        .filter(|p| p.manifest.claims.draft_kinds.iter().any(|k| k.as_str() == kind))
        .map(|p| {
            let score = match (p.root.detect_draft(), dir) {
                (Some(f), Some(d)) => f(RStr::from_str(&d.to_string_lossy()), RStr::from_str(config.as_deref().unwrap_or(""))),
                _ => 0,
            };
            (score, p)
        })
        .collect();
    candidates.sort_by(|a, b| b.0.cmp(&a.0));
    let Some((_, plugin)) = candidates.first() else {
        let kinds: Vec<String> = registry.of_kind(PluginKind::DRAFTER).flat_map(|p| p.manifest.claims.draft_kinds.iter().map(|k| k.to_string()).collect::<Vec<_>>()).collect();
        return Err(format!("no drafter plugin implements draft kind `{kind}` (loaded kinds: {})", if kinds.is_empty() { "none".into() } else { kinds.join(", ") }));
    };
    let open = plugin.root.open_drafter().ok_or_else(|| format!("plugin `{}` has no open_drafter entry", plugin.name()))?;
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
        options: options.iter().map(|(k, v)| abi_stable::std_types::Tuple2(RString::from(k.as_str()), RString::from(v.as_str()))).collect(),
    };
    let services = HostServices_TO::from_value(Services { registry: registry.clone(), dtype }, TD_Opaque);
    let drafter = open(&args, services).into_result().map_err(|e| format!("drafter `{}`: {e}", plugin.name()))?;
    Ok((plugin.name().to_owned(), drafter))
}
