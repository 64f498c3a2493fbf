//! The target's K/V a drafter reads (`Drafter::target_kv`): its picks
//! resolved once against the target's plan and layouts, and each round the
//! row's views asked of those layers' caches (`CacheLayout::kv_view`) and
//! lent to `draft_kv`. The host names no drafter kind: a pick is a role
//! (last full, last sliding layer) or a plan index, and whether a layout
//! can lend is its `kv-view:<scheme>` tag.

use crate::error::EngineError;
use crate::tensors::{tensor_array, tensor_ref};
use host_loader::compose::ComposedModel;
use plugin_api::abi_stable::std_types::RSlice;
use plugin_api::{caps, CacheBox, Draft, DraftArgs, DrafterBox, KvPick, KvRole, NeedKind, PluginError, TargetKv};

/// One resolved pick: the plan layer and what the drafter is told of it.
#[derive(Clone, Debug, PartialEq)]
pub struct KvLayer {
    pub layer: usize,
    pub kind: NeedKind,
    pub window: u32,
}

/// Resolves `picks` against `target`, or says in one line why it cannot:
/// no layer in that role, an index out of range, a layout that lends no
/// view in its layer's scheme.
pub fn resolve(kind: &str, picks: &[KvPick], target: &ComposedModel) -> Result<Vec<KvLayer>, EngineError> {
    let layers = &target.plan.layers;
    let last_of = |k: NeedKind| layers.iter().rposition(|n| n.kind == k);
    picks
        .iter()
        .map(|p| {
            let found = match p.role {
                KvRole::LAST_FULL => last_of(NeedKind::FULL),
                KvRole::LAST_SLIDING => last_of(NeedKind::SLIDING),
                KvRole::INDEX => Some(p.index as usize).filter(|&i| i < layers.len()),
                _ => None,
            };
            let layer = found.ok_or_else(|| {
                EngineError::Config(match p.role {
                    KvRole::INDEX => format!(
                        "the `{kind}` drafter reads the K/V of cached layer {}, the target caches {} layers",
                        p.index,
                        layers.len()
                    ),
                    role => format!("the `{kind}` drafter reads the K/V of {}, which the target has not", role.name()),
                })
            })?;
            let plugin = &target.layouts[layer];
            let scheme = &target.layer_schemes[layer];
            let scheme_name = scheme.split(':').next().unwrap_or(scheme);
            let tag = format!("{}{scheme_name}", caps::KV_VIEW_PREFIX);
            let lends = target.layout_caps.iter().any(|(n, c)| n == plugin && c.contains(&tag));
            if !lends {
                return Err(EngineError::Config(format!(
                    "the `{kind}` drafter reads the K/V of cached layer {layer}, which its cache layout `{plugin}` \
                     cannot lend in scheme `{scheme}` (no `{tag}`)"
                )));
            }
            let need = &layers[layer];
            Ok(KvLayer { layer, kind: need.kind, window: need.window })
        })
        .collect()
}

/// Asks `drafter` for a round: `draft_kv` with row `row`'s views of
/// `layers` when it reads any, `draft` otherwise.
pub fn draft(
    drafter: &mut DrafterBox,
    args: DraftArgs<'_>,
    layers: &[KvLayer],
    caches: &[CacheBox],
    row: u32,
) -> Result<Draft, PluginError> {
    if layers.is_empty() {
        return drafter.draft(args).into_result();
    }
    let mut held = Vec::with_capacity(layers.len());
    for l in layers {
        let v = caches[l.layer].kv_view(row).into_result()?;
        held.push((tensor_array(v.keys), tensor_array(v.values), v.first));
    }
    let views: Vec<TargetKv<'_>> = layers
        .iter()
        .zip(&held)
        .map(|(l, (k, v, first))| TargetKv {
            layer: l.layer as u32,
            kind: l.kind,
            window: l.window,
            keys: tensor_ref(k),
            values: tensor_ref(v),
            first: *first,
        })
        .collect();
    drafter.draft_kv(args, RSlice::from_slice(&views)).into_result()
}
