//! Causal multi-token attention at a shape cuDNN has already planned.
//!
//! On a CUDA device MLX sends a causal chunk too large for the unfused path
//! (`short_attention`) to cuDNN, which plans a graph for every new
//! (queries, keys) shape: 60-90 ms of host time on the H200 while the GPU
//! waits, against ~5 ms for the attention itself (a 2047-token chunk after
//! 2048 tokens; docs/benchmarks.md, "New prompt lengths and cuDNN's graph
//! builds"). Nearly every prompt's last chunk has a length new to the
//! process. Padding the queries and the keys/values at their end by the
//! same `p` rows keeps the diagonal where it was (MLX aligns a causal mask
//! to the bottom right), so every real query sees exactly the keys it saw
//! before and the padded rows, sliced off, see only padding and real keys.
//! With the query count rounded up to a multiple of [`BUCKET`] a process
//! meets at most `2048 / BUCKET` shapes per prefix length, and cuDNN's plan
//! cache keeps them. The real rows' values equal the unpadded call's: bit
//! for bit through cuDNN on the H100 (`tests/bench/gpu/sdpa_bucket_probe.py`),
//! and through MLX's CPU fallback in `bucketed_rows_equal_the_unpadded_call`.

use crate::{Array, Result};
use mlx_rs::fast::ScaledDotProductAttentionMask;

/// Queries are padded to a multiple of this many rows (MLX's K/V cache
/// step, so keys after whole 2048-token chunks stay on 256-multiples).
pub const BUCKET: i32 = 256;

/// `x` `[B, H, L, D]` with `p` zero rows appended on the sequence axis.
fn pad_end(x: &Array, p: i32) -> Result<Array> {
    let s = x.shape();
    let zeros = crate::ops::zeros(&[s[0], s[1], p, s[3]], x.dtype())?;
    mlx_rs::ops::concatenate(&[x.clone(), zeros], 2)
}

/// Causal `q` `[B, Hq, L, D]` over `k`/`v` `[B, Hkv, S, D]` (S >= L) through
/// MLX's fused attention, padded to the next [`BUCKET`] of query rows when
/// `bucket` is set (on a GPU; on the CPU there is no per-shape plan).
/// cuDNN's plan is keyed by strides as well as shapes, so a bucketed call
/// always hands over row-major arrays: a chunk already on a bucket whose
/// queries came out of a fused kernel, or whose keys are a slice of wider
/// storage, would otherwise plan again.
pub fn causal(q: &Array, k: &Array, v: &Array, scale: f32, bucket: bool) -> Result<Array> {
    let attend = |q: &Array, k: &Array, v: &Array| {
        mlx_rs::fast::scaled_dot_product_attention(q, k, v, scale, ScaledDotProductAttentionMask::Causal, None)
    };
    let l = q.shape()[2];
    if !bucket || k.shape()[2] < l {
        return attend(q, k, v);
    }
    let p = (BUCKET - l % BUCKET) % BUCKET;
    let fit = |x: &Array| if p == 0 { crate::ops::contiguous(x) } else { pad_end(x, p) };
    let out = attend(&fit(q)?, &fit(k)?, &fit(v)?)?;
    if p == 0 {
        return Ok(out);
    }
    crate::ops::slice(&out, &[0, 0, 0, 0], &[out.shape()[0], out.shape()[1], l, out.shape()[3]])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_arrays::normal;

    /// The padded call attends each real query over the keys the unpadded
    /// one does: a padding that moved the causal diagonal would let real
    /// queries see other keys, and the rows would differ by far more than
    /// float32 rounding.
    #[test]
    fn bucketed_rows_equal_the_unpadded_call() {
        for (l, past) in [(3, 0), (37, 0), (37, 11), (256, 5)] {
            let q = normal(&[1, 4, l, 16], 1);
            let k = normal(&[1, 2, past + l, 16], 2);
            let v = normal(&[1, 2, past + l, 16], 3);
            let plain = causal(&q, &k, &v, 0.25, false).unwrap();
            let padded = causal(&q, &k, &v, 0.25, true).unwrap();
            assert_eq!(padded.shape(), plain.shape());
            let diff = plain.subtract(&padded).unwrap().abs().unwrap().max(None).unwrap().item_cast::<f32>();
            assert!(diff < 1e-5, "L={l} past={past}: the padded call differs by {diff}");
        }
    }
}
