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
//! The kernel: one block of 8 warps per (row, K/V head, slice of the keys).
//! A key's packed words are split over `LPK` lanes (16, or fewer when a
//! row has fewer words), so a warp scores `32 / LPK` keys at once, and each
//! lane loads `U` keys' words, scales and biases before it uses any (bytes
//! in flight are what a bandwidth-bound kernel needs). A lane's dimensions
//! lie in one quantization group, so its partial score is
//! `scale * (q . codes) + bias * sum(q)`; the partial scores reduce over
//! the key's lanes only (`log2 LPK` shuffles), and each lane slot keeps an
//! online softmax (running maximum, sum and weighted values, in float32)
//! over its keys. The slots of a warp, then the warps of the block, are
//! merged; the slices (`splits`, so that short batches still fill the GPU)
//! are merged by model-kit's `merge_slices` (model-kit's masked decode
//! kernel is the one-key-per-warp form of this over plain K/V). Longer
//! queries (prompts, speculative verifies) and other masks take the
//! dequantized route (`attention`).
//!
//! What bounds it is the instructions issued per key, not memory: at 16
//! rows of 32k tokens it moves 0.8 TB/s of codes. So codes become floats
//! without integer conversions, the running sums are rescaled only when a
//! maximum moves, and a value's bias is summed once per key. Staging the
//! rows through shared memory (`cp.async`) added instructions and measured
//! slower (docs/benchmarks.md, "The codes kernel alone").

use crate::attention::QMask;
use crate::codec::{Affine, Widths};
use model_kit::cuda_kernel::{cached, Cached, CudaKernel, Launch, Template};
use model_kit::decode_attention::{merge_slices, splits, BLOCK_MERGE, THREADS};
use model_kit::{error, Array, Dtype, Result};
use plugin_sdk::mlx_rs;

/// The kernel's body up to the block's merge (model-kit's `BLOCK_MERGE`).
const SOURCE: &str = r#"
    constexpr int WARPS = 8;
    constexpr int LPK = (D * BITS / 32) < 16 ? (D * BITS / 32) : 16;
    constexpr int KPW = 32 / LPK;
    constexpr int DPL = D / LPK;
    constexpr int CPW = 32 / BITS;
    constexpr int WPL = DPL / CPW;
    constexpr int NWS = D * BITS / 32 * PER_WORD;
    constexpr int NG = D / GROUP;
    constexpr unsigned LOW = (1u << BITS) - 1;
    constexpr int STEP = WARPS * KPW;
    auto value_of = [](auto bits) -> float {
        if constexpr (VALUES == 0) return __bfloat162float(__ushort_as_bfloat16(bits));
        else if constexpr (VALUES == 1) return __half2float(__ushort_as_half(bits));
        else return __uint_as_float(bits);
    };
    // Code j of a packed word as a float, exactly: the code's bits as the
    // low mantissa bits of 2^23, less 2^23 (no integer conversion, which
    // issues at a fraction of the FP32 rate).
    auto code = [](uint32_t w, int j) -> float {
        if constexpr (BITS == 8) return __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7540 + j)) - 8388608.f;
        else return __uint_as_float(0x4B000000u | ((w >> (j * BITS)) & LOW)) - 8388608.f;
    };
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int slot = lane / LPK;
    const int sl = lane % LPK;
    const int g = sl * DPL / GROUP;
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
    float qv[R][DPL], qs[R];
    for (int r = 0; r < R; ++r) {
        qs[r] = 0.f;
        for (int i = 0; i < DPL; ++i) {
            qv[r][i] = static_cast<float>(q[(size_t)b * q_strides[0] + (size_t)(h * R + r) * q_strides[1]
                                            + (size_t)(sl * DPL + i) * q_strides[2]]);
            qs[r] += qv[r][i];
        }
    }
    // acc holds sum(p * scale * code) per dimension and vb sum(p * bias):
    // a lane's dimensions share one group, so a value's bias is added once
    // per key, not once per dimension (vb joins acc after the loop).
    float m[R], l[R], vb[R], acc[R][DPL];
    for (int r = 0; r < R; ++r) {
        m[r] = -INFINITY;
        l[r] = 0.f;
        vb[r] = 0.f;
        for (int i = 0; i < DPL; ++i) acc[r][i] = 0.f;
    }
    const size_t kbase = (size_t)b * k_strides[0] + (size_t)h * k_strides[1];
    const size_t vbase = (size_t)b * v_strides[0] + (size_t)h * v_strides[1];
    for (int tw = t0 + warp * KPW; tw < t1; tw += STEP * U) {
        uint32_t kw[U][WPL], vw[U][WPL];
        float ks[U], kz[U], vs[U], vz[U];
        bool ok[U];
        for (int u = 0; u < U; ++u) {
            const int t = tw + slot + u * STEP;
            ok[u] = t < t1 && (!HAS_MASK || mask[(size_t)b * mask_strides[0] + (size_t)t * mask_strides[1]]);
            // A key past the slice or masked out is read at t0 (always in
            // the slice) and weighs nothing: no lane branches around loads.
            const int tt = ok[u] ? t : t0;
            const auto* krow = k + kbase + (size_t)tt * k_strides[2];
            const auto* vrow = v + vbase + (size_t)tt * v_strides[2];
            const uint32_t* kp = reinterpret_cast<const uint32_t*>(krow) + sl * WPL;
            const uint32_t* vp = reinterpret_cast<const uint32_t*>(vrow) + sl * WPL;
            for (int w = 0; w < WPL; ++w) {
                kw[u][w] = kp[w];
                vw[u][w] = vp[w];
            }
            ks[u] = value_of(krow[NWS + g]);
            kz[u] = value_of(krow[NWS + NG + g]);
            vs[u] = value_of(vrow[NWS + g]);
            vz[u] = value_of(vrow[NWS + NG + g]);
        }
        float s[U][R];
        for (int u = 0; u < U; ++u) {
            float c[DPL];
            for (int w = 0; w < WPL; ++w)
                for (int j = 0; j < CPW; ++j) c[w * CPW + j] = code(kw[u][w], j);
            for (int r = 0; r < R; ++r) {
                float dq = 0.f;
                for (int i = 0; i < DPL; ++i) dq = fmaf(qv[r][i], c[i], dq);
                s[u][r] = ks[u] * dq + kz[u] * qs[r];
            }
        }
        for (int o = LPK / 2; o > 0; o >>= 1)
            for (int u = 0; u < U; ++u)
                for (int r = 0; r < R; ++r) s[u][r] += __shfl_xor_sync(0xffffffff, s[u][r], o);
        float p[U][R];
        for (int r = 0; r < R; ++r) {
            float mn = m[r];
            for (int u = 0; u < U; ++u) {
                if (!ok[u]) s[u][r] = -INFINITY;
                mn = fmaxf(mn, s[u][r]);
            }
            // What was summed is rescaled only when the running maximum
            // moves, which after the first keys is rare (the lanes of a key
            // agree on it: their scores were reduced alike).
            if (mn > m[r]) {
                const float corr = __expf(m[r] - mn);
                l[r] *= corr;
                vb[r] *= corr;
                for (int i = 0; i < DPL; ++i) acc[r][i] *= corr;
                m[r] = mn;
            }
            // No key seen yet: every weight is exp(-inf) = 0 against 0.
            const float base = m[r] == -INFINITY ? 0.f : m[r];
            for (int u = 0; u < U; ++u) {
                p[u][r] = __expf(s[u][r] - base);
                l[r] += p[u][r];
            }
        }
        for (int u = 0; u < U; ++u) {
            float c[DPL];
            for (int w = 0; w < WPL; ++w)
                for (int j = 0; j < CPW; ++j) c[w * CPW + j] = code(vw[u][w], j);
            for (int r = 0; r < R; ++r) {
                const float pv = p[u][r] * vs[u];
                vb[r] = fmaf(p[u][r], vz[u], vb[r]);
                for (int i = 0; i < DPL; ++i) acc[r][i] = fmaf(pv, c[i], acc[r][i]);
            }
        }
    }
    for (int r = 0; r < R; ++r)
        for (int i = 0; i < DPL; ++i) acc[r][i] += vb[r];
    for (int o = LPK; o < 32; o <<= 1) {
        for (int r = 0; r < R; ++r) {
            const float mo = __shfl_xor_sync(0xffffffff, m[r], o);
            const float lo = __shfl_xor_sync(0xffffffff, l[r], o);
            const float mn = fmaxf(m[r], mo);
            const float base = mn == -INFINITY ? 0.f : mn;
            const float mine = __expf(m[r] - base), theirs = __expf(mo - base);
            l[r] = l[r] * mine + lo * theirs;
            for (int i = 0; i < DPL; ++i)
                acc[r][i] = acc[r][i] * mine + __shfl_xor_sync(0xffffffff, acc[r][i], o) * theirs;
            m[r] = mn;
        }
    }
    __shared__ float sm_m[WARPS][R];
    __shared__ float sm_l[WARPS][R];
    __shared__ float sm_acc[WARPS][R][D];
    if (slot == 0) {
        for (int r = 0; r < R; ++r) {
            if (sl == 0) {
                sm_m[warp][r] = m[r];
                sm_l[warp][r] = l[r];
            }
            for (int i = 0; i < DPL; ++i) sm_acc[warp][r][sl * DPL + i] = acc[r][i];
        }
    }
"#;

/// Keys each lane slot loads before it uses any (see the module doc): 2
/// measured best at 16 rows of 32k tokens (1 and 4 were 1.26x and 1.39x
/// slower; docs/benchmarks.md, "The codes kernel alone").
const UNROLL: i32 = 2;
/// Blocks the GPU should get at least: four per SM of an H200 (132 SMs).
const TARGET_BLOCKS: i32 = 528;

fn kernel() -> Result<&'static CudaKernel> {
    static KERNEL: Cached = Cached::new();
    cached(&KERNEL, || {
        let source = format!("{SOURCE}{BLOCK_MERGE}");
        CudaKernel::new("kv_codes_decode_attention", &["q", "k", "v", "mask"], &["part", "ml"], &source)
    })
}

/// How many lanes share a key of `d` dimensions at `bits` bits: 16, or
/// the row's packed words when fewer, each lane holding whole words; None
/// where that does not split evenly (the caller then dequantizes).
fn lanes_per_key(d: i32, bits: i32) -> Option<i32> {
    let words = d * bits / 32;
    let lanes = words.min(16);
    (d > 0 && d * bits % 32 == 0 && lanes > 0 && (lanes as u32).is_power_of_two() && words % lanes == 0)
        .then_some(lanes)
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
    let fits = model_kit::ops::on_gpu()
        && l == 1
        && kb == b
        && r > 0
        && lanes_per_key(d, codec.bits).is_some()
        && d == plain.k
        && d == plain.v
        && r * d <= 1024
        && codec.group % (d / lanes_per_key(d, codec.bits).unwrap_or(1)) == 0
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
    let splits = splits(b, hkv, t, TARGET_BLOCKS);
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
                Template::Int("U", UNROLL),
            ],
        },
    )?;
    let [part, ml]: [Array; 2] = outs.try_into().map_err(|_| error("the codes kernel returned other outputs"))?;
    merge_slices(&part, &ml, splits, [b, hq, 1, d], q.dtype()).map(Some)
}
