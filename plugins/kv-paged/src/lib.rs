//! Cache layout `kv-paged` (scheme `paged:block=<n>`): keys and values for
//! full-attention layers in the model's dtype, kept in fixed-size blocks of
//! a pool, with a block table per row.
//!
//! Each layer's caches share one pool (`pool`): one K and one V array of
//! block slots (`storage`), grown geometrically, written in place. Rows
//! that share a prefix (a prefix-cache hit, a row merged from a state
//! another row exported, the choices of one request) hold the same blocks
//! by reference (`row`), so joining, leaving and sharing copy no K/V; full
//! blocks are immutable while shared, and a row's partly filled last block
//! is its own (copy-on-write when a row trims back into a shared block).
//! Exported states carry their blocks' keys, so an import takes the blocks
//! still alive by reference (`registry`, `state`).
//!
//! MLX has no paged-attention kernel, so `update_and_fetch` gathers the
//! rows' blocks into one `[B, H, T, D]` view for the layer's attention with
//! ONE `take` by the block tables (`view`; on the GPU one launch of our
//! copy kernel, `gather_kernel`): the cost of a step follows the tokens
//! attended, not the number of blocks. Rows of equal length get
//! kv-plain's geometry exactly (greedy output is kv-plain's); rows that
//! differ are aligned by whole blocks under an explicit mask. The view is
//! transient: it lives for one layer's attention.

mod gather_kernel;
mod layout;
mod pool;
mod registry;
mod row;
mod state;
mod storage;
#[cfg(test)]
mod tests;
mod view;

use layout::PagedKv;
use model_kit::ops::dtype_from_raw;
use plugin_api::abi_stable::sabi_trait::TD_Opaque;
use plugin_api::*;
use plugin_sdk::rstrings;

plugin_sdk::export_plugin! {
    manifest: manifest,
    new_cache: new_cache,
}

/// The scheme's name as layouts claim it and `CacheSpec.scheme` carries it.
pub const SCHEME: &str = "paged";

fn manifest() -> PluginManifest {
    plugin_sdk::manifest!(
        PluginKind::CACHE_LAYOUT,
        "K/V for full attention in a pool of fixed-size blocks shared by reference between rows (paged)",
        Claims { cache_needs: rstrings(&["full"]), cache_schemes: rstrings(&[SCHEME]), ..Default::default() },
        &[caps::TRIM, caps::SPEC_ROUND, caps::STATE_IO, caps::ROWS, caps::PLAIN_FETCH],
    )
}

/// The block size of `paged:block=<n>` (`paged` alone: 16).
pub fn block_size(scheme: &str) -> Result<usize, String> {
    let (name, params) = scheme.split_once(':').unwrap_or((scheme, ""));
    if name != SCHEME {
        return Err(format!("kv-paged serves scheme `{SCHEME}`, not `{name}`"));
    }
    let mut block = 16;
    for kv in params.split(',').filter(|p| !p.is_empty()) {
        match kv.split_once('=') {
            Some(("block", n)) => {
                block = n.parse().map_err(|_| format!("kv-paged: block `{n}` is not a number"))?;
            }
            _ => return Err(format!("kv-paged: unknown scheme parameter `{kv}`")),
        }
    }
    if !(1..=4096).contains(&block) {
        return Err(format!("kv-paged: block {block} out of range (1 to 4096 tokens)"));
    }
    Ok(block)
}

fn new_cache(spec: &CacheSpec) -> std::result::Result<CacheBox, PluginError> {
    if spec.need.kind != NeedKind::FULL {
        return Err(PluginError::unsupported(format!(
            "kv-paged serves full attention, not `{}`",
            spec.need.kind.as_str()
        )));
    }
    let block = block_size(spec.scheme.as_str()).map_err(PluginError::unsupported)?;
    let dtype = dtype_from_raw(spec.dtype.0).map_err(|e| PluginError::invalid_input(e.what()))?;
    let kv = PagedKv::new(
        spec.rows as usize,
        block,
        spec.need.kv_heads as i32,
        spec.need.k_head_dim as i32,
        spec.need.v_head_dim as i32,
        dtype,
    );
    Ok(CacheLayout_TO::from_value(kv, TD_Opaque))
}
