//! Cache layout `kv-rotating`: keys and values for sliding-window attention
//! layers, kept exactly as mlx-lm keeps them (mlx-lm 0.32.2,
//! `mlx_lm/models/cache.py`), so that attention sees the same keys in the
//! same storage order and greedy decoding matches token for token: a serial
//! cache as `RotatingKVCache`, batch rows as `BatchRotatingKVCache`.
//!
//! One ring serves both: a serial cache is the batched ring with one row
//! (`ring.rs`: `max_size = window` slots, `keep = 0`, mlx-lm's updates).
//! Around it: `masks.rs` (each class's `make_mask`), `state.rs` (each
//! class's state format), `rows.rs` (merge/extend/filter/extract/
//! begin_padded), `round.rs` (speculative rounds: trim or replay for one
//! row, per-row rollback for a batch), `layout.rs` (the `CacheLayout`
//! methods, answering as the serial or the batched class), `geometry.rs`
//! and `columns.rs` (shapes, and array helpers along the token axis).
//!
//! Schemes: `plain`, and the affine ones (`affine8`, `affine4`): the same
//! ring holding each token's codes (`kv_quant::Quantized` around it; the
//! ring only moves whole token columns, so quantizing a token once as it
//! arrives equals quantizing the window mlx-lm's ring would attend over).
//! mlx-lm has no quantized rotating cache (`RotatingKVCache.to_quantized`
//! raises); this one is its ring with the codes of `QuantizedKVCache`.
//!
//! Capabilities: `trim` while the ring has not wrapped (mlx-lm's
//! `is_trimmable`: `offset < max_size`), `spec-round` (a serial ring refuses
//! it once wrapped; the batched one rolls back per row), `state-io`, `rows`.

use kv_quant::{KvCodec, Quantized, Scheme, Widths};
use model_kit::ops::dtype_from_raw;
use plugin_api::abi_stable::sabi_trait::TD_Opaque;
use plugin_api::*;
use plugin_sdk::rstrings;

mod columns;
mod geometry;
mod in_codes;
mod layout;
mod masks;
mod ring;
mod round;
mod rows;
mod state;

use geometry::Geometry;
use layout::RotatingKv;

plugin_sdk::export_plugin! {
    manifest: manifest,
    new_cache: new_cache,
}

fn manifest() -> PluginManifest {
    plugin_sdk::manifest!(
        PluginKind::CACHE_LAYOUT,
        "sliding-window K/V in a ring of `window` slots, as mlx-lm's RotatingKVCache",
        Claims {
            cache_needs: rstrings(&["sliding"]),
            cache_schemes: rstrings(&["plain", Scheme::AFFINE[0], Scheme::AFFINE[1]]),
            ..Default::default()
        },
        &[caps::TRIM, caps::SPEC_ROUND, caps::STATE_IO, caps::ROWS, "kv-view:plain"],
    )
}

fn new_cache(spec: &CacheSpec) -> std::result::Result<CacheBox, PluginError> {
    if spec.need.kind != NeedKind::SLIDING {
        return Err(PluginError::unsupported(format!(
            "kv-rotating serves sliding-window attention, not `{}`",
            spec.need.kind.as_str()
        )));
    }
    let scheme =
        Scheme::parse(spec.scheme.as_str()).map_err(|e| PluginError::unsupported(format!("kv-rotating: {e}")))?;
    if let Some(Scheme { codec: KvCodec::Turbo(_), .. }) = scheme {
        // TurboQuant is for full-attention layers (the host gives sliding
        // ones a plain ring); its rotated values would fit the ring too,
        // but nothing measured it there.
        return Err(PluginError::unsupported("kv-rotating: no scheme `turbo` (full-attention layers only)"));
    }
    if spec.need.window == 0 {
        return Err(PluginError::invalid_input("kv-rotating: a sliding layer needs a window > 0"));
    }
    let dtype = dtype_from_raw(spec.dtype.0).map_err(|e| PluginError::invalid_input(e.what()))?;
    let window = spec.need.window as usize;
    let geo = Geometry {
        max_size: window,
        window,
        step: spec.step.max(1) as usize,
        heads: spec.need.kv_heads as i32,
        k_dim: spec.need.k_head_dim as i32,
        v_dim: spec.need.v_head_dim as i32,
        dtype,
    };
    // One row is a serial cache; a batch cache starts with 0 rows (filled
    // by merges or `begin_padded`) or B unpadded ones.
    let cache = match spec.rows {
        1 => RotatingKv::serial(geo),
        rows => RotatingKv::batch(geo, rows as usize),
    };
    match scheme {
        None => Ok(CacheLayout_TO::from_value(cache, TD_Opaque)),
        Some(scheme) => {
            let plain = Widths { k: geo.k_dim, v: geo.v_dim, dtype };
            let q = Quantized::new(cache, scheme, plain)
                .map_err(|e| PluginError::invalid_input(format!("kv-rotating: {e}")))?;
            Ok(CacheLayout_TO::from_value(q, TD_Opaque))
        }
    }
}

#[cfg(test)]
mod batch_tests;
#[cfg(test)]
mod serial_tests;
