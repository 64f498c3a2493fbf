//! mlx-lm's `quantized_scaled_dot_product_attention` (models/base.py), op
//! for op: queries scaled in their dtype, scores by a transposed quantized
//! matmul against the key codes, the mask applied as mlx-lm applies it
//! (`where(mask, scores, finfo.min)` for a boolean mask, the causal one
//! built from indices), a precise softmax, then a quantized matmul against
//! the value codes. Grouped-query heads share their K/V head through a
//! broadcast axis, as there.
//!
//! MLX's CUDA backend has no quantized matmul for codes read in place from
//! a cache (its kernels want contiguous operands, and keys transposed with
//! groups as wide as the head): there the codes are dequantized and the
//! fused attention runs over them (`Route::Dequantized`). The K/V stay
//! codes in the cache; the dequantized copy lives for one layer's call.

use crate::codec::{Affine, Codes};
use model_kit::attention::{sdpa, Mask};
use model_kit::ops::scalar;
use model_kit::{error, Array, Dtype, Result};
use plugin_sdk::mlx_rs;

/// The mask the graph gives, as `CacheLayout::attend` receives it.
pub enum QMask {
    None,
    /// Causal, aligned to the end of the keys (mlx-lm's `"causal"`).
    Causal,
    /// Boolean `[B, 1, L, K]` (or broadcastable), true where a query may
    /// attend; an additive float mask is added.
    Array(Array),
}

/// How attention reads the codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// Quantized matmuls over the codes, as mlx-lm (the CPU).
    QuantizedMatmul,
    /// The GPU: one query per row over affine codes reads them in place
    /// (`codes_attention`); otherwise the codes dequantized, then the fused
    /// attention.
    Dequantized,
}

impl Route {
    /// The route the default device runs.
    pub fn for_device() -> Self {
        if model_kit::ops::on_gpu() {
            Route::Dequantized
        } else {
            Route::QuantizedMatmul
        }
    }
}

impl QMask {
    /// The same mask as model-kit's attention takes it.
    pub(crate) fn as_mask(&self) -> Mask {
        match self {
            QMask::None => Mask::None,
            QMask::Causal => Mask::Causal,
            QMask::Array(m) => Mask::Array(m.clone()),
        }
    }
}

/// The lowest finite value of `dtype` (mlx's `finfo(dtype).min`).
fn lowest(dtype: Dtype) -> Result<Array> {
    let min = dtype.finfo_min().map_err(|e| error(e.to_string()))?;
    scalar(min, dtype)
}

/// Attention of `q` `[B, Hq, L, D]` over the codes of `keys` and `values`
/// (`[B, Hkv, T, *]` parts): `[B, Hq, L, Dv]`.
pub fn quantized_sdpa(
    q: &Array,
    keys: &Codes,
    values: &Codes,
    scale: f32,
    mask: &QMask,
    codec: Affine,
) -> Result<Array> {
    let weights = attention_weights(q, keys, scale, mask, codec)?;
    let (b, heads, l) = (q.shape()[0], q.shape()[1], q.shape()[2]);
    let repeats = heads / keys.words.shape()[1];
    let v = if repeats > 1 { spread(values)? } else { shallow(values) };
    let out = mlx_rs::ops::quantized_matmul(&weights, &v.words, &v.scales, &v.biases, false, codec.group, codec.bits)?;
    if repeats > 1 {
        return out.reshape(&[b, heads, l, -1]);
    }
    Ok(out)
}

/// Attention of `q` `[B, Hq, L, D]` over `keys` and `values` dequantized
/// to `q`'s dtype, by model-kit's attention (fused where it is).
pub fn dequantized_sdpa(
    q: &Array,
    keys: &Codes,
    values: &Codes,
    scale: f32,
    mask: &QMask,
    codec: Affine,
) -> Result<Array> {
    let k = dequantize(keys, codec, q.dtype())?;
    let v = dequantize(values, codec, q.dtype())?;
    sdpa(q, &k, &v, scale, &mask.as_mask())
}

/// The values of `c` in `dtype`.
pub(crate) fn dequantize(c: &Codes, codec: Affine, dtype: Dtype) -> Result<Array> {
    mlx_rs::ops::dequantize(&c.words, &c.scales, &c.biases, codec.group, codec.bits)?.as_dtype(dtype)
}

/// The softmax weights of `q` over the key codes, masked: `[B, Hkv,
/// repeats, L, T]` for grouped-query heads, else `[B, H, L, T]`.
pub(crate) fn attention_weights(q: &Array, keys: &Codes, scale: f32, mask: &QMask, codec: Affine) -> Result<Array> {
    let (b, heads, l, d) = match q.shape() {
        &[b, h, l, d] => (b, h, l, d),
        s => return Err(error(format!("quantized attention: queries {s:?} are not [B, H, L, D]"))),
    };
    let kv_heads = keys.words.shape()[1];
    if kv_heads == 0 || heads % kv_heads != 0 {
        return Err(error(format!("quantized attention: {heads} query heads over {kv_heads} K/V heads")));
    }
    let repeats = heads / kv_heads;
    let mut queries = q.multiply(scalar(scale as f64, q.dtype())?)?;
    let k = if repeats > 1 {
        queries = queries.reshape(&[b, kv_heads, repeats, l, d])?;
        spread(keys)?
    } else {
        shallow(keys)
    };
    let mut scores =
        mlx_rs::ops::quantized_matmul(&queries, &k.words, &k.scales, &k.biases, true, codec.group, codec.bits)?;
    match mask {
        QMask::None => {}
        QMask::Causal => {
            let s = scores.shape();
            let (ql, kl) = (s[s.len() - 2], s[s.len() - 1]);
            let q_idx = Array::arange::<_, i32>(kl - ql, kl, 1)?.reshape(&[ql, 1])?;
            let k_idx = Array::arange::<_, i32>(0, kl, 1)?.reshape(&[1, kl])?;
            let m = q_idx.ge(&k_idx)?;
            scores = mlx_rs::ops::select(&m, &scores, &lowest(scores.dtype())?)?;
        }
        QMask::Array(m) => {
            // `[B, 1, L, K]` against `[B, Hkv, repeats, L, K]`: a broadcast
            // axis where the K/V heads' repeats are (mlx-lm: `ndim > 3`).
            let m = if repeats > 1 && m.ndim() > 3 { m.expand_dims(-3)? } else { m.clone() };
            scores = if m.dtype() == Dtype::Bool {
                mlx_rs::ops::select(&m, &scores, &lowest(scores.dtype())?)?
            } else {
                scores.add(&m)?
            };
        }
    }
    mlx_rs::ops::softmax_axes(&scores, &[-1], true)
}

/// The parts with a broadcast axis for the heads that share them.
fn spread(c: &Codes) -> Result<Codes> {
    Ok(Codes { words: c.words.expand_dims(-3)?, scales: c.scales.expand_dims(-3)?, biases: c.biases.expand_dims(-3)? })
}

fn shallow(c: &Codes) -> Codes {
    Codes { words: c.words.clone(), scales: c.scales.clone(), biases: c.biases.clone() }
}
