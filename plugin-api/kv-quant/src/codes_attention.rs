//! Decode attention that reads affine K/V codes in place on the GPU: one
//! query per row (a decode step) over a layer's stored code rows, in a CUDA
//! kernel of our own (model-kit's `cuda_kernel`). MLX 0.32's CUDA backend
//! has no quantized matmul for codes read in place, and dequantizing a
//! layer's whole K/V for each call cost 2.3-18x the bf16 attention on an
//! H200. Reading the codes moves fewer bytes than bf16 K/V: at 16 rows of
//! 32k tokens this kernel takes 0.70-0.77x the time of MLX's fused bf16
//! attention per layer (docs/benchmarks.md, "The codes kernel alone").
//!
//! The products run on tensor cores (`mma.sync` m16n8k16, f16 operands,
//! f32 sums), because a kernel doing them one lane at a time was bound by
//! the instructions it issued per key (about 2700), not by memory. One
//! block of 8 warps per (row, K/V head, slice of the keys); a warp takes 16
//! keys at a time:
//! - scores: the query heads sharing the K/V head are the A rows (up to 8
//!   of the 16), the keys' dequantized codes the B columns; each lane
//!   unpacks two codes of one word into an f16 pair with no integer
//!   conversion (1024 + code is exact in f16), scales and offsets them by
//!   the key's group (`__hfma2`), and the query's dimensions are loaded in
//!   the order the lanes unpack them;
//! - an online softmax per head over the 4 lanes that hold its scores
//!   (rescaled only when the running maximum moves);
//! - values: the weights as the A operand straight from the scores' layout,
//!   each lane dequantizing one dimension of four keys per product.
//!
//! The warps are merged by model-kit's `BLOCK_MERGE`, the slices (`splits`,
//! so that short batches still fill the GPU) by its `merge_slices`. Codes
//! dequantized in f16 are closer to exact than the bf16 values MLX's
//! `dequantize` gives. Longer queries (prompts, speculative verifies),
//! other masks, float32 K/V and more than 8 query heads per K/V head take
//! the dequantized route (`scheme`).

use crate::attention::QMask;
use crate::codec::{Affine, Widths};
use model_kit::cuda_kernel::{cached, Cached, CudaKernel, Launch, Template};
use model_kit::decode_attention::{merge_slices, splits, BLOCK_MERGE, THREADS};
use model_kit::{error, Array, Dtype, Result};
use plugin_sdk::mlx_rs;

/// The kernel's body up to the block's merge (model-kit's `BLOCK_MERGE`).
const SOURCE: &str = r#"
    constexpr int WARPS = 8;
    constexpr int KS = D / 16;
    constexpr int NT = D / 8;
    constexpr int NWS = D * BITS / 32 * 2;
    constexpr int NG = D / GROUP;
    constexpr int VW = NT * BITS / 32;
    auto value_of = [](unsigned short bits) -> float {
        if constexpr (VALUES == 0) return __bfloat162float(__ushort_as_bfloat16(bits));
        else return __half2float(__ushort_as_half(bits));
    };
    auto pack = [](float a, float b) -> uint32_t {
        __half2 x = __floats2half2_rn(a, b);
        return *reinterpret_cast<uint32_t*>(&x);
    };
    // Two codes at bits [0, BITS) and [16, 16 + BITS) of x, dequantized
    // into a half2: 1024 + code is exact in f16's mantissa, so the codes
    // need no integer conversion.
    auto dequant = [](uint32_t x, __half2 scale, __half2 bias) -> uint32_t {
        uint32_t bits = x | 0x64006400u;
        __half2 c = __hsub2(*reinterpret_cast<__half2*>(&bits), __floats2half2_rn(1024.f, 1024.f));
        __half2 y = __hfma2(c, scale, bias);
        return *reinterpret_cast<uint32_t*>(&y);
    };
    // c[0..1] += A (rows: query heads; only row gq is nonzero) x B, where
    // the f32 accumulator rows gq + 8 are not used.
    auto mma = [](float& c0, float& c1, uint32_t a0, uint32_t a2, uint32_t b0, uint32_t b1) {
        float j2, j3;
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%10,%11,%12,%13};\n"
                     : "=f"(c0), "=f"(c1), "=f"(j2), "=f"(j3)
                     : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1), "f"(c0), "f"(c1), "f"(0.f), "f"(0.f));
    };
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int gq = lane >> 2, tq = lane & 3;
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
    // The query heads as the products' A operand (row gq: head gq), its
    // dimensions in the order the lanes unpack the codes of a key.
    auto qf = [&](int d) -> float {
        return gq < R ? static_cast<float>(q[(size_t)b * q_strides[0] + (size_t)(h * R + gq) * q_strides[1]
                                             + (size_t)d * q_strides[2]])
                      : 0.f;
    };
    uint32_t qa[KS][2];
    for (int ks = 0; ks < KS; ++ks) {
        if constexpr (BITS == 4) {
            const int d = 16 * ks + tq;
            qa[ks][0] = pack(qf(d), qf(d + 4));
            qa[ks][1] = pack(qf(d + 8), qf(d + 12));
        } else {
            const int d = 16 * ks + 4 * tq;
            qa[ks][0] = pack(qf(d), qf(d + 1));
            qa[ks][1] = pack(qf(d + 2), qf(d + 3));
        }
    }
    float m = -INFINITY, l = 0.f, o[NT][2];
    for (int nt = 0; nt < NT; ++nt) o[nt][0] = o[nt][1] = 0.f;
    const size_t kbase = (size_t)b * k_strides[0] + (size_t)h * k_strides[1];
    const size_t vbase = (size_t)b * v_strides[0] + (size_t)h * v_strides[1];
    auto kept = [&](int t) {
        return t < t1 && (!HAS_MASK || mask[(size_t)b * mask_strides[0] + (size_t)t * mask_strides[1]]);
    };
    // The value dimensions lane gq reads: gq * NT + nt for n-tile nt, one group.
    const int gv = gq * NT / GROUP;
    for (int tb = t0 + warp * 16; tb < t1; tb += WARPS * 16) {
        // Scores of head gq for keys tb + 8j + 2tq + e (row gq, columns
        // 2tq + e of the product's C); B column gq is key tb + 8j + gq.
        float s[2][2];
        for (int j = 0; j < 2; ++j) {
            const int key = tb + 8 * j + gq;
            const auto* row = k + kbase + (size_t)(kept(key) ? key : t0) * k_strides[2];
            const uint32_t* w = reinterpret_cast<const uint32_t*>(row);
            __half2 sc2[NG], bi2[NG];
            for (int g = 0; g < NG; ++g) {
                sc2[g] = __float2half2_rn(value_of(row[NWS + g]));
                bi2[g] = __float2half2_rn(value_of(row[NWS + NG + g]));
            }
            s[j][0] = s[j][1] = 0.f;
            for (int ks = 0; ks < KS; ++ks) {
                const int g = 16 * ks / GROUP;
                // This lane's four codes of the k-step's 16 dimensions:
                // codes tq and tq + 4 of each of its two words (4-bit), or
                // the four of word tq (8-bit), the order `qa` follows.
                uint32_t b0, b1;
                if constexpr (BITS == 4) {
                    b0 = (w[2 * ks] >> (4 * tq)) & 0x000F000Fu;
                    b1 = (w[2 * ks + 1] >> (4 * tq)) & 0x000F000Fu;
                } else {
                    const uint32_t x = w[4 * ks + tq];
                    b0 = __byte_perm(x, 0u, 0x4140);
                    b1 = __byte_perm(x, 0u, 0x4342);
                }
                mma(s[j][0], s[j][1], qa[ks][0], qa[ks][1], dequant(b0, sc2[g], bi2[g]), dequant(b1, sc2[g], bi2[g]));
            }
        }
        bool ok[2][2];
        float mx = m;
        for (int j = 0; j < 2; ++j)
            for (int e = 0; e < 2; ++e) {
                ok[j][e] = kept(tb + 8 * j + 2 * tq + e);
                if (!ok[j][e]) s[j][e] = -INFINITY;
                mx = fmaxf(mx, s[j][e]);
            }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));
        // The running sums are rescaled only when the maximum moves (the
        // four lanes of a head agree on it).
        if (mx > m) {
            const float corr = __expf(m - mx);
            l *= corr;
            for (int nt = 0; nt < NT; ++nt) {
                o[nt][0] *= corr;
                o[nt][1] *= corr;
            }
            m = mx;
        }
        const float base = m == -INFINITY ? 0.f : m;
        float p[2][2];
        for (int j = 0; j < 2; ++j)
            for (int e = 0; e < 2; ++e) {
                p[j][e] = __expf(s[j][e] - base);
                l += p[j][e];
            }
        const uint32_t pa0 = pack(p[0][0], p[0][1]), pa2 = pack(p[1][0], p[1][1]);
        // Values of the keys 2tq, 2tq + 1 (b0) and 8 + 2tq, 9 + 2tq (b1):
        // their words holding lane gq's dimensions, scales and biases.
        uint32_t vw[4][VW];
        __half2 vs[2], vz[2];
        {
            float sv[4], zv[4];
            for (int i = 0; i < 4; ++i) {
                const int key = tb + (i >> 1) * 8 + 2 * tq + (i & 1);
                const bool okv = ok[i >> 1][i & 1];
                const auto* row = v + vbase + (size_t)(okv ? key : t0) * v_strides[2];
                const uint32_t* w = reinterpret_cast<const uint32_t*>(row) + gq * VW;
                for (int x = 0; x < VW; ++x) vw[i][x] = w[x];
                sv[i] = value_of(row[NWS + gv]);
                zv[i] = value_of(row[NWS + NG + gv]);
            }
            vs[0] = __floats2half2_rn(sv[0], sv[1]);
            vz[0] = __floats2half2_rn(zv[0], zv[1]);
            vs[1] = __floats2half2_rn(sv[2], sv[3]);
            vz[1] = __floats2half2_rn(zv[2], zv[3]);
        }
        // B column gq of n-tile nt is dimension gq * NT + nt: code nt of the
        // lane's words, from two keys at once (the two halves of a pair).
        for (int nt = 0; nt < NT; ++nt) {
            uint32_t b[2];
            for (int hi = 0; hi < 2; ++hi) {
                const uint32_t wa = vw[2 * hi][nt * BITS / 32], wb = vw[2 * hi + 1][nt * BITS / 32];
                if constexpr (BITS == 4) {
                    const int byte = (nt % 8) / 2;
                    const uint32_t x = __byte_perm(wa, wb, byte | ((4 + byte) << 8));
                    b[hi] = (x >> (4 * (nt & 1))) & 0x000F000Fu;
                } else {
                    const int byte = nt % 4;
                    b[hi] = __byte_perm(wa, wb, byte | ((4 + byte) << 8)) & 0x00FF00FFu;
                }
                b[hi] = dequant(b[hi], vs[hi], vz[hi]);
            }
            mma(o[nt][0], o[nt][1], pa0, pa2, b[0], b[1]);
        }
    }
    l += __shfl_xor_sync(0xffffffff, l, 1);
    l += __shfl_xor_sync(0xffffffff, l, 2);
    __shared__ float sm_m[WARPS][R];
    __shared__ float sm_l[WARPS][R];
    __shared__ float sm_acc[WARPS][R][D];
    if (gq < R) {
        if (tq == 0) {
            sm_m[warp][gq] = m;
            sm_l[warp][gq] = l;
        }
        for (int nt = 0; nt < NT; ++nt)
            for (int e = 0; e < 2; ++e) sm_acc[warp][gq][(2 * tq + e) * NT + nt] = o[nt][e];
    }
"#;

/// Blocks the GPU should get at least: four per SM of an H200 (132 SMs).
const TARGET_BLOCKS: i32 = 528;

fn kernel() -> Result<&'static CudaKernel> {
    static KERNEL: Cached = Cached::new();
    cached(&KERNEL, || {
        let source = format!("{SOURCE}{BLOCK_MERGE}");
        CudaKernel::new("kv_codes_decode_attention", &["q", "k", "v", "mask"], &["part", "ml"], &source)
    })
}

/// Whether the kernel's layout of a head of `d` dimensions works: whole
/// k-steps of 16 dimensions; a lane's `d / 8` value dimensions in whole
/// words and inside one group.
pub(crate) fn head_dim_fits(d: i32, codec: Affine) -> bool {
    let per_lane = d / 8;
    d > 0 && d % 16 == 0 && codec.group % per_lane == 0 && per_lane * codec.bits % 32 == 0
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
        _ => return Ok(None),
    };
    let fits = model_kit::ops::on_gpu()
        && l == 1
        && kb == b
        && (1..=8).contains(&r)
        && head_dim_fits(d, codec)
        && d == plain.k
        && d == plain.v
        && r * d <= 1024
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
                Template::Int("VALUES", values_as),
                Template::Bool("HAS_MASK", mask.is_some()),
            ],
        },
    )?;
    let [part, ml]: [Array; 2] = outs.try_into().map_err(|_| error("the codes kernel returned other outputs"))?;
    merge_slices(&part, &ml, splits, [b, hq, 1, d], q.dtype()).map(Some)
}
