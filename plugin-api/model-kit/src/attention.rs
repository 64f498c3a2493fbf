//! Attention through a cache-layout plugin. The graph never knows the
//! layout's type: it asks for positions and a mask, hands over new keys and
//! values, and attends over what comes back (see plugin_api::cache). A
//! family that attends through [`attend`] (and advertises
//! `caps::LAYOUT_ATTENTION`) lets the layout attend itself where it stores
//! K/V in a form plain attention cannot read (quantized schemes).

pub use crate::mask::Mask;
use crate::rope::Position;
use crate::{error, Array, Result};
use mlx_rs::fast::ScaledDotProductAttentionMask;
use plugin_api::abi_stable::std_types::{ROption, RResult};
use plugin_api::{CacheBox, MaskMode, MaskRef, PluginError};
use plugin_sdk::{into_array, into_tensor, lend};

fn boundary<T>(r: RResult<T, PluginError>) -> Result<T> {
    r.into_result().map_err(|e| error(format!("cache layout: {e}")))
}

impl Mask {
    pub fn for_cache(cache: &CacheBox, queries: i32) -> Result<Self> {
        let m = boundary(cache.attention_mask(queries as u32))?;
        Ok(match (m.mode, m.array) {
            (MaskMode::NONE, _) => Mask::None,
            (MaskMode::CAUSAL, _) => Mask::Causal,
            (MaskMode::ARRAY, ROption::RSome(a)) => Mask::Array(into_array(a)),
            (mode, _) => return Err(error(format!("cache layout returned mask mode {} without an array", mode.0))),
        })
    }
}

/// The masks of one forward pass, `[full, sliding]`: one per attention kind,
/// asked of the first layer of that kind before any cache is updated (as
/// mlx-lm computes `fa_mask` / `swa_mask`). A kind no layer uses is `None`.
pub fn masks_by_kind(
    caches: &[CacheBox],
    is_sliding: impl Fn(usize) -> bool,
    queries: i32,
) -> Result<[Option<Mask>; 2]> {
    let first = |sliding: bool| -> Result<Option<Mask>> {
        match (0..caches.len()).find(|&i| is_sliding(i) == sliding) {
            Some(i) => Ok(Some(Mask::for_cache(&caches[i], queries)?)),
            None => Ok(None),
        }
    };
    Ok([first(false)?, first(true)?])
}

/// RoPE positions of one layer's next tokens.
pub fn positions(cache: &CacheBox) -> Result<Position> {
    let p = boundary(cache.positions())?;
    Ok(match p.per_row {
        ROption::RSome(a) => Position::PerRow(into_array(a)),
        ROption::RNone => Position::Offset(i32::try_from(p.offset).map_err(|_| error("cache offset overflows i32"))?),
    })
}

/// Stores `keys`/`values` `[B, H, L, D]` and returns everything to attend over.
pub fn update(cache: &mut CacheBox, keys: Array, values: Array) -> Result<(Array, Array)> {
    let kv = boundary(cache.update_and_fetch(into_tensor(keys), into_tensor(values)))?;
    Ok((into_array(kv.keys), into_array(kv.values)))
}

/// Stores `keys`/`values` `[B, H, L, D]` and attends `q` over the layer's
/// K/V: the layout's own attention when it has one (`CacheLayout::attend`,
/// e.g. quantized matmuls over a quantized scheme), else
/// `update_for_queries` (the layout's update, ordered before the attention
/// that reads it) then [`sdpa`]. Use it wherever the graph needs the attention
/// output only (no K/V kept for other layers).
pub fn attend(cache: &mut CacheBox, q: &Array, keys: Array, values: Array, scale: f32, mask: &Mask) -> Result<Array> {
    let mask_ref = MaskRef {
        mode: match mask {
            Mask::None => MaskMode::NONE,
            Mask::Causal => MaskMode::CAUSAL,
            Mask::Array(_) => MaskMode::ARRAY,
        },
        array: match mask {
            Mask::Array(a) => ROption::RSome(lend(a)),
            _ => ROption::RNone,
        },
    };
    let own = boundary(cache.attend(lend(q), lend(&keys), lend(&values), scale, mask_ref))?;
    let out = match own {
        ROption::RSome(out) => into_array(out),
        ROption::RNone => {
            // The layout hands the queries back through its write, if it writes in place.
            let kv =
                boundary(cache.update_for_queries(into_tensor(q.clone()), into_tensor(keys), into_tensor(values)))?;
            let written = kv.written_in_place;
            let (q, k, v) = (into_array(kv.queries), into_array(kv.keys), into_array(kv.values));
            routed(&q, &k, &v, scale, mask, written.then_some(&q))?
        }
    };
    schedule_on_cpu(&out)?;
    Ok(out)
}

/// On the CPU, queues the layer's attention so far on MLX's stream while
/// the host goes on building the rest of the pass. MLX's eval waits
/// whenever more than ten of its tasks are in flight, so an `async_eval` of
/// a whole step returns only when the step has nearly run: the next step's
/// graph would then be built while the CPU stream idles. Queued a layer at
/// a time, the stream computes one layer while the host builds the next
/// (docs/benchmarks.md, "A layer at a time on the CPU stream"). Not on a
/// GPU, where each `async_eval` commits a CUDA graph of its own.
fn schedule_on_cpu(out: &Array) -> Result<()> {
    if crate::ops::on_gpu() {
        return Ok(());
    }
    mlx_rs::transforms::async_eval([out])
}

/// `mx.fast.scaled_dot_product_attention` with the mask's mode; multi-token
/// queries on a GPU attend one by one (up to 16, causal) or unfused while
/// their scores stay small (`short_attention` says why), and longer causal
/// chunks at a bucketed shape (`bucketed_attention` says why); a masked
/// decode step on a GPU (rows of different lengths) goes to our kernel,
/// where MLX has no fused one (`decode_attention` says why), as do short
/// unmasked or causal queries at a head size MLX's fused kernels do not
/// take (`decode_attention::unmasked`).
pub fn sdpa(q: &Array, k: &Array, v: &Array, scale: f32, mask: &Mask) -> Result<Array> {
    routed(q, k, v, scale, mask, None)
}

/// [`sdpa`]; `after_write`: the queries a layout passed through its
/// in-place write of `k`/`v` (`KvQueries::written_in_place`). The routes
/// up to MLX's single-query kernel read K/V in the kernels that take the
/// queries, so MLX runs them after the write; the others read K/V in
/// kernels of their own too (copies, padding, a matmul's staging), so the
/// queries, and with them the write, are scheduled before those are built.
fn routed(q: &Array, k: &Array, v: &Array, scale: f32, mask: &Mask, after_write: Option<&Array>) -> Result<Array> {
    if let Mask::Array(m) = mask {
        if let Some(out) = crate::decode_attention::masked(q, k, v, scale, m)? {
            return Ok(out);
        }
    }
    if matches!(mask, Mask::None | Mask::Causal) {
        if let Some(out) = crate::decode_attention::unmasked(q, k, v, scale, matches!(mask, Mask::Causal))? {
            return Ok(out);
        }
    }
    if crate::short_attention::per_query_wanted(q.shape(), mask) {
        return crate::short_attention::per_query(q, k, v, scale, mask);
    }
    if q.shape()[2] == 1 && matches!(mask, Mask::None) {
        return mlx_rs::fast::scaled_dot_product_attention(q, k, v, scale, None, None);
    }
    if let Some(queries) = after_write {
        mlx_rs::transforms::async_eval([queries])?;
    }
    if crate::short_attention::wanted(q.shape(), k.shape()[2]) {
        return crate::short_attention::unfused(q, k, v, scale, mask);
    }
    match mask {
        Mask::None => mlx_rs::fast::scaled_dot_product_attention(q, k, v, scale, None, None),
        Mask::Causal => {
            let bucket = crate::routes::current().bucket_causal && crate::ops::on_gpu();
            crate::bucketed_attention::causal(q, k, v, scale, bucket)
        }
        Mask::Array(m) => {
            mlx_rs::fast::scaled_dot_product_attention(q, k, v, scale, ScaledDotProductAttentionMask::Array(m), None)
        }
    }
}
