//! Decode attention that reads affine K/V codes in place on the GPU: one
//! query per row (a decode step) over a layer's stored code rows, in a CUDA
//! kernel of our own (model-kit's `cuda_kernel`). MLX 0.32's CUDA backend
//! has no quantized matmul for codes read in place, and dequantizing a
//! layer's whole K/V for each call cost 2.3-18x the bf16 attention on an
//! H200; reading the codes costs less than bf16 K/V, since there are fewer
//! bytes to read (docs/benchmarks.md, "KV cache schemes": 8-bit codes decode
//! a 32k-token row 1.36x faster than bf16 K/V at the Qwen3-8B shape, with
//! the same next-token divergence as the dequantized route).
//!
//! The kernel: one block of 8 warps per (row, K/V head, slice of the keys);
//! a warp takes one key at a time, each lane dequantizing `D / 32` of its
//! dimensions (and of the value's) in registers (in float32), for every
//! query head sharing the K/V head; scores reduce across the warp, and an
//! online softmax keeps each warp's running maximum, sum and weighted
//! values. The block merges its warps; the slices (`splits`, so that short
//! batches still fill the GPU) are merged by model-kit's `merge_slices`
//! (model-kit's masked decode kernel is this one over plain K/V). Longer queries
//! (prompts, speculative verifies) and other masks take the dequantized
//! route (`attention`).

use crate::attention::QMask;
use crate::codec::{Affine, Widths};
use model_kit::cuda_kernel::{cached, Cached, CudaKernel, Launch, Template};
use model_kit::decode_attention::{merge_slices, splits, SOFTMAX_TAIL, THREADS};
use model_kit::{error, Array, Dtype, Result};
use plugin_sdk::mlx_rs;

/// The kernel up to the key loop's softmax update: each key scored from
/// affine codes dequantized in registers; `SOFTMAX_TAIL` completes it.
const SOURCE: &str = r#"
    constexpr int WARPS = 8;
    constexpr int DPL = D / 32;
    constexpr int NWS = D * BITS / 32 * PER_WORD;
    constexpr int NG = D / GROUP;
    auto value_of = [](auto bits) -> float {
        if constexpr (VALUES == 0) return __bfloat162float(__ushort_as_bfloat16(bits));
        else if constexpr (VALUES == 1) return __half2float(__ushort_as_half(bits));
        else return __uint_as_float(bits);
    };
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int blk = blockIdx.x;
    const int splits = gridDim.x / (q_shape[0] * HKV);
    const int bh = blk / splits;
    const int split = blk % splits;
    const int b = bh / HKV;
    const int h = bh % HKV;
    const int T = k_shape[2];
    const int per = (T + splits - 1) / splits;
    const int t0 = split * per;
    const int t1 = min(T, t0 + per);
    float qv[R][DPL];
    for (int r = 0; r < R; ++r)
        for (int i = 0; i < DPL; ++i)
            qv[r][i] = static_cast<float>(q[(size_t)b * q_strides[0] + (size_t)(h * R + r) * q_strides[1]
                                            + (size_t)(lane * DPL + i) * q_strides[2]]);
    float m[R], l[R], acc[R][DPL];
    for (int r = 0; r < R; ++r) {
        m[r] = -INFINITY;
        l[r] = 0.f;
        for (int i = 0; i < DPL; ++i) acc[r][i] = 0.f;
    }
    const size_t kb = (size_t)b * k_strides[0] + (size_t)h * k_strides[1];
    const size_t vb = (size_t)b * v_strides[0] + (size_t)h * v_strides[1];
    for (int t = t0 + warp; t < t1; t += WARPS) {
        if (HAS_MASK && !mask[(size_t)b * mask_strides[0] + (size_t)t * mask_strides[1]]) continue;
        const auto* krow = k + kb + (size_t)t * k_strides[2];
        const auto* vrow = v + vb + (size_t)t * v_strides[2];
        const uint32_t* kw = reinterpret_cast<const uint32_t*>(krow);
        const uint32_t* vw = reinterpret_cast<const uint32_t*>(vrow);
        float s[R];
        for (int r = 0; r < R; ++r) s[r] = 0.f;
        float vv[DPL];
        for (int i = 0; i < DPL; ++i) {
            const int d = lane * DPL + i;
            const int bo = d * BITS;
            const int g = d / GROUP;
            const float kq = (float)((kw[bo / 32] >> (bo % 32)) & ((1u << BITS) - 1));
            const float kval = value_of(krow[NWS + g]) * kq + value_of(krow[NWS + NG + g]);
            const float vq = (float)((vw[bo / 32] >> (bo % 32)) & ((1u << BITS) - 1));
            vv[i] = value_of(vrow[NWS + g]) * vq + value_of(vrow[NWS + NG + g]);
            for (int r = 0; r < R; ++r) s[r] += qv[r][i] * kval;
        }
"#;

fn kernel() -> Result<&'static CudaKernel> {
    static KERNEL: Cached = Cached::new();
    cached(&KERNEL, || {
        let source = format!("{SOURCE}{SOFTMAX_TAIL}");
        CudaKernel::new("kv_codes_decode_attention", &["q", "k", "v", "mask"], &["part", "ml"], &source)
    })
}

/// Attention of one query per row, `q` `[B, Hq, 1, D]`, over the stored
/// affine code rows `keys` / `values` (`[B, Hkv, T, width]`, read in
/// place), or None where this kernel does not apply (more queries, a mask
/// that is not boolean, shapes it was not built for): the caller then
/// dequantizes.
pub fn decode_attention(
    q: &Array,
    keys: &Array,
    values: &Array,
    plain: Widths,
    scale: f32,
    mask: &QMask,
    codec: Affine,
) -> Result<Option<Array>> {
    let (&[b, hq, l, d], &[kb, hkv, t, _]) = (q.shape(), keys.shape()) else { return Ok(None) };
    let r = if hkv > 0 && hq % hkv == 0 { hq / hkv } else { 0 };
    let values_as = match plain.dtype {
        Dtype::Bfloat16 => 0,
        Dtype::Float16 => 1,
        Dtype::Float32 => 2,
        _ => return Ok(None),
    };
    let fits = l == 1
        && kb == b
        && r > 0
        && d % 32 == 0
        && d == plain.k
        && d == plain.v
        && r * d <= 1024
        && codec.group >= d / 32
        && values.shape()[..3] == keys.shape()[..3]
        && t > 0;
    if !fits {
        return Ok(None);
    }
    let mask = match mask {
        QMask::None | QMask::Causal => None,
        QMask::Array(m) if m.dtype() == Dtype::Bool && (m.size() as i32 == b * t || m.size() as i32 == t) => {
            Some(mlx_rs::ops::broadcast_to(&m.reshape(&[-1, t])?, &[b, t])?)
        }
        QMask::Array(_) => return Ok(None),
    };
    let no_mask = Array::from_slice(&[false], &[1]);
    let splits = splits(b, hkv, t);
    let blocks = b * hkv * splits;
    let scaled = q.multiply(Array::from_f32(scale).as_dtype(q.dtype())?)?.reshape(&[b, hq, d])?;
    let per_word = if values_as == 2 { 1 } else { 2 };
    let outs = kernel()?.apply(
        &[&scaled, keys, values, mask.as_ref().unwrap_or(&no_mask)],
        &Launch {
            grid: [blocks * THREADS, 1, 1],
            threads: [THREADS, 1, 1],
            outputs: &[(&[blocks, r, d], Dtype::Float32), (&[blocks, r, 2], Dtype::Float32)],
            template: &[
                Template::Int("BITS", codec.bits),
                Template::Int("GROUP", codec.group),
                Template::Int("D", d),
                Template::Int("R", r),
                Template::Int("HKV", hkv),
                Template::Int("PER_WORD", per_word),
                Template::Int("VALUES", values_as),
                Template::Bool("HAS_MASK", mask.is_some()),
            ],
        },
    )?;
    let [part, ml]: [Array; 2] = outs.try_into().map_err(|_| error("the codes kernel returned other outputs"))?;
    merge_slices(&part, &ml, splits, [b, hq, 1, d], q.dtype()).map(Some)
}
