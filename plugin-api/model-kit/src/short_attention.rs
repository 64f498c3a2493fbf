//! Attention for multi-token queries (speculative verify widths, a drafter's
//! catch-up step, prefill chunks) as plain matmul + softmax, the way MLX's
//! own fallback computes it, when the scores it materialises stay small.
//!
//! Why: on a CUDA device MLX's fused kernel serves 1-token queries only;
//! longer ones go to cuDNN, which builds a graph for every new shape. A
//! verify round's key length is new every round, and so is almost every
//! prompt's: each build cost about 40-70 ms on the H200 (measured: a 4-wide
//! verify of a 28-layer model took 45 ms on first sight of its key length,
//! 6 ms when repeated; prefill of a new 1000-token prompt ran at 11-16k
//! tok/s fused and 38k unfused; docs/benchmarks.md). Matmuls have no
//! per-shape setup. Past `MAX_SCORES` elements the fused kernel's
//! not materialising the scores matters more. On the CPU MLX already takes
//! this path inside `fast::scaled_dot_product_attention`.
//!
//! Shorter still (up to `routes::PER_QUERY_MAX` queries, causal or unmasked: a
//! serial verify, a drafter's catch-up), each query attends alone through
//! the fused single-query kernel over its causal prefix of the keys (a
//! free slice), as a decode step does. The matmuls of the unfused path
//! have a new shape every round too (the key length grows), and on the
//! H200 handing a 4-wide verify of a 28-layer model to the device took
//! 7-11 ms of host time against 2.5 ms for a 1-token step
//! (docs/benchmarks.md). Per-query attention is also the decode step's
//! arithmetic, so a verify's logits stay closest to plain decoding's.

use crate::mask::Mask;
use crate::{Array, Result};
use mlx_rs::ops::select;
use mlx_rs::Dtype;

/// The most score elements (batch x query heads x queries x keys) the
/// unfused path materialises: 2^26, 128 MiB in bf16. Measured on the H200
/// with prompt lengths new to the process: at 16 heads (Qwen3-0.6B) a
/// 2000-token prompt (2^26 scores) prefilled 1.5x faster unfused; at 32
/// heads (Qwen3-8B) a 1000-token one (2^25) 1.4x faster unfused, while
/// 2000 tokens (2^27) and the 2048-token chunks of 4000 ran 1.1-1.2x faster
/// through MLX's sdpa (docs/benchmarks.md, "Prefill of new prompt lengths").
pub const MAX_SCORES: i64 = 1 << 26;

fn per_query_limit() -> i32 {
    crate::routes::current().per_query_max
}

/// Whether queries `q` `[B, Hq, L, D]` with `mask` should take [`per_query`]
/// on the current device (checked before [`wanted`]).
pub fn per_query_wanted(q: &[i32], mask: &Mask) -> bool {
    matches!(mask, Mask::None | Mask::Causal) && (2..=per_query_limit()).contains(&q[2]) && crate::ops::on_gpu()
}

/// Each query `i` of q `[B, Hq, L, D]` through MLX's fused kernel alone over
/// the keys it may see: all S with no mask; the first `S - L + i + 1` when
/// causal (query i sits at key position S - L + i). Head sizes MLX has no
/// fused kernel for take `decode_attention::unmasked` before this, all
/// queries in one launch.
pub fn per_query(q: &Array, k: &Array, v: &Array, scale: f32, mask: &Mask) -> Result<Array> {
    use mlx_rs::ops::indexing::IndexOp;
    let (l, s) = (q.shape()[2], k.shape()[2]);
    // One copy to `[B, L, Hq, D]`, then each query is a view the kernel
    // takes as it is (heads `D` apart, as a decode step's query); a slice
    // of `[B, Hq, L, D]` would be copied once per query instead.
    let by_position = q.swap_axes(1, 2)?.contiguous()?;
    let rows = (0..l)
        .map(|i| {
            let qi = by_position.index((.., i..i + 1, .., ..)).swap_axes(1, 2)?;
            let seen = if matches!(mask, Mask::Causal) { s - l + i + 1 } else { s };
            let (ki, vi) = if seen == s {
                (k.clone(), v.clone())
            } else {
                (k.index((.., .., ..seen, ..)), v.index((.., .., ..seen, ..)))
            };
            mlx_rs::fast::scaled_dot_product_attention(&qi, &ki, &vi, scale, None, None)
        })
        .collect::<Result<Vec<_>>>()?;
    mlx_rs::ops::concatenate(&rows, 2)
}

fn limit() -> i32 {
    crate::routes::current().unfused_max
}

/// Whether queries `q` `[B, Hq, L, D]` over `keys` keys should take
/// [`unfused`] on the current device.
pub fn wanted(q: &[i32], keys: i32) -> bool {
    let (b, h, l) = (q[0] as i64, q[1] as i64, q[2]);
    (2..=limit()).contains(&l) && b * h * l as i64 * keys as i64 <= MAX_SCORES && crate::ops::on_gpu()
}

/// The most negative score a masked position gets (finite, so a row whose
/// keys are all masked, a padding row, stays finite as in the fused kernel).
fn masked_score(dtype: Dtype) -> Array {
    let v = if dtype == Dtype::Float16 { -65504.0 } else { -1e30 };
    Array::from_f32(v).as_dtype(dtype).expect("a float dtype")
}

/// What every full-attention layer of one forward shares: the causal keep
/// mask `[L, S]` and the masked score. Built once per (L, S, dtype) instead
/// of once per layer: on a GPU the host's graph building is the bottleneck
/// for small models, and these were four of the path's dozen ops per layer.
struct Shared {
    key: (i32, i32, Dtype),
    keep: Array,
    low: Array,
}

thread_local! {
    static SHARED: std::cell::RefCell<Option<Shared>> = const { std::cell::RefCell::new(None) };
}

fn causal_and_low(l: i32, s: i32, dtype: Dtype) -> Result<(Array, Array)> {
    SHARED.with(|cell| {
        if let Some(sh) = cell.borrow().as_ref().filter(|sh| sh.key == (l, s, dtype)) {
            return Ok((sh.keep.clone(), sh.low.clone()));
        }
        // Query i sits at key position s - l + i.
        let rows = Array::arange::<_, i32>(s - l, s, 1)?.reshape(&[l, 1])?;
        let keep = rows.ge(&Array::arange::<_, i32>(0, s, 1)?)?;
        let low = masked_score(dtype);
        *cell.borrow_mut() = Some(Shared { key: (l, s, dtype), keep: keep.clone(), low: low.clone() });
        Ok((keep, low))
    })
}

/// softmax(q·kᵀ·scale + mask)·v for q `[B, Hq, L, D]` over k, v `[B, Hkv, S, D]`
/// (grouped heads: Hq a multiple of Hkv). Masks as in `fast::scaled_dot_product_attention`:
/// causal aligns the queries with the last L keys; an array mask is boolean
/// (keep) or additive, broadcast over `[B, Hq, L, S]`.
pub fn unfused(q: &Array, k: &Array, v: &Array, scale: f32, mask: &Mask) -> Result<Array> {
    let (qs, ks) = (q.shape(), k.shape());
    let (b, hq, l, d) = (qs[0], qs[1], qs[2], qs[3]);
    let (hkv, s) = (ks[1], ks[2]);
    let rep = hq / hkv;
    let q = q.multiply(Array::from_f32(scale).as_dtype(q.dtype())?)?;
    let (q, k, v) = if rep > 1 {
        (q.reshape(&[b, hkv, rep, l, d])?, k.expand_dims(2)?, v.expand_dims(2)?)
    } else {
        (q, k.clone(), v.clone())
    };
    let mut scores = q.matmul(k.swap_axes(-1, -2)?)?;
    match mask {
        Mask::None => {}
        Mask::Causal => {
            let (keep, low) = causal_and_low(l, s, scores.dtype())?;
            scores = select(&keep, &scores, &low)?;
        }
        Mask::Array(m) => {
            // `[.., H or 1, L, S]` → grouped `[.., Hkv, rep or 1, L, S]`.
            let m = if rep > 1 && m.ndim() >= 3 {
                let h = m.shape()[m.ndim() - 3];
                if h == 1 {
                    m.expand_dims(-3)?
                } else {
                    let mut shape = m.shape().to_vec();
                    let at = shape.len() - 3;
                    shape.splice(at..at + 1, [hkv, rep]);
                    m.reshape(&shape)?
                }
            } else {
                m.clone()
            };
            let low = masked_score(scores.dtype());
            scores = if m.dtype() == Dtype::Bool {
                select(&m, &scores, &low)?
            } else {
                scores.add(&m.as_dtype(scores.dtype())?)?
            };
        }
    }
    let p = mlx_rs::ops::softmax_axis(&scores, -1, true)?;
    let out = p.matmul(&v)?;
    if rep > 1 {
        out.reshape(&[b, hq, l, -1])
    } else {
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_arrays::normal;
    use mlx_rs::fast::{scaled_dot_product_attention, ScaledDotProductAttentionMask};

    fn close(a: &Array, b: &Array) {
        assert_eq!(a.shape(), b.shape());
        let diff = a.subtract(b).unwrap().abs().unwrap().max(None).unwrap().item_cast::<f32>();
        assert!(diff < 1e-5, "max difference {diff}");
    }

    /// Grouped heads (4 query heads over 2 kv heads), 3 queries over 7 keys.
    fn qkv() -> (Array, Array, Array) {
        (normal(&[2, 4, 3, 8], 1), normal(&[2, 2, 7, 8], 2), normal(&[2, 2, 7, 8], 3))
    }

    type Path = fn(&Array, &Array, &Array, f32, &Mask) -> Result<Array>;

    /// `path` equals the fused op, causal and unmasked.
    fn agrees_with_the_fused_op(path: Path, (q, k, v): &(Array, Array, Array)) {
        let want = scaled_dot_product_attention(q, k, v, 0.35, ScaledDotProductAttentionMask::Causal, None).unwrap();
        close(&path(q, k, v, 0.35, &Mask::Causal).unwrap(), &want);
        let want = scaled_dot_product_attention(q, k, v, 0.35, None, None).unwrap();
        close(&path(q, k, v, 0.35, &Mask::None).unwrap(), &want);
    }

    #[test]
    fn per_query_matches_the_fused_op_causal_and_unmasked() {
        agrees_with_the_fused_op(per_query, &qkv());
    }

    #[test]
    fn causal_matches_the_fused_op() {
        let (q, k, v) = qkv();
        agrees_with_the_fused_op(unfused, &(q.clone(), k.clone(), v.clone()));
        // Another shape after the first: the shared causal mask is rebuilt, not reused.
        let (q2, k2, v2) = (normal(&[1, 4, 2, 8], 6), normal(&[1, 2, 5, 8], 7), normal(&[1, 2, 5, 8], 8));
        let want =
            scaled_dot_product_attention(&q2, &k2, &v2, 0.35, ScaledDotProductAttentionMask::Causal, None).unwrap();
        close(&unfused(&q2, &k2, &v2, 0.35, &Mask::Causal).unwrap(), &want);
        let want = scaled_dot_product_attention(&q, &k, &v, 0.35, ScaledDotProductAttentionMask::Causal, None).unwrap();
        close(&unfused(&q, &k, &v, 0.35, &Mask::Causal).unwrap(), &want);
    }

    #[test]
    fn boolean_and_additive_masks_match_the_fused_op() {
        let (q, k, v) = qkv();
        // A padded row layout as kv-plain builds it: [B, 1, L, S], row 1 left-padded by 2.
        let rows = Array::arange::<_, i32>(4, 7, 1).unwrap().reshape(&[3, 1]).unwrap();
        let cols = Array::arange::<_, i32>(0, 7, 1).unwrap();
        let pads = Array::from_slice(&[0i32, 2], &[2, 1, 1, 1]);
        let keep = rows.ge(&cols).unwrap().logical_and(cols.ge(&pads).unwrap()).unwrap();
        let want =
            scaled_dot_product_attention(&q, &k, &v, 0.35, ScaledDotProductAttentionMask::Array(&keep), None).unwrap();
        close(&unfused(&q, &k, &v, 0.35, &Mask::Array(keep.clone())).unwrap(), &want);
        // Additive, one mask per query head: [1, 4, 3, 7].
        let add = normal(&[1, 4, 3, 7], 4);
        let want =
            scaled_dot_product_attention(&q, &k, &v, 0.35, ScaledDotProductAttentionMask::Array(&add), None).unwrap();
        close(&unfused(&q, &k, &v, 0.35, &Mask::Array(add)).unwrap(), &want);
    }

    #[test]
    fn only_multi_token_queries_with_small_scores_on_a_gpu_take_it() {
        // This machine's default device decides; 1-token queries, queries
        // past the limit and scores past MAX_SCORES never do.
        assert!(!wanted(&[1, 16, 1, 64], 100) && !wanted(&[1, 16, limit() + 1, 64], 4096));
        assert!(!wanted(&[1, 16, 2048, 64], 32768), "16 x 2048 x 32768 scores are past MAX_SCORES");
        assert_eq!(wanted(&[1, 16, 4, 64], 100), crate::ops::on_gpu());
        assert_eq!(wanted(&[8, 16, 512, 64], 1024), crate::ops::on_gpu());
    }
}
