//! Per-head RMSNorm of the queries and keys, then RoPE, as one kernel on a
//! GPU decode step (Qwen3's `q_norm`/`k_norm` before the rotation; Qwen3.5's
//! gated attention, whose rotation covers part of each head): the separate
//! route is a reshape, a norm, a transpose and a rotation for each of q and
//! k, eight graph nodes a layer the host builds and launches. Output is
//! `[B, heads, L, D]`, what attention takes.
//!
//! Numerics follow MLX's kernels: the norm writes `w * T(x * normalizer)`
//! rounded to bf16, the rotation computes in float32 from the rounded input
//! with `inv_freq = 2^(-d / (R / 2) * log2(base))` (or `1 / freqs[d]`) over
//! the first `R` dims and rounds once; dims past `R` pass through.

use crate::cuda_kernel::{cached, Cached, CudaKernel, Launch, Template};
use crate::layers::RmsNorm;
use crate::rope::{Position, Rope};
use crate::{ops, routes, Array, Dtype, Result};

/// One warp per (row, token, head) of `q` / `k` (`[B, L, heads, D]`, or
/// `[B, L, heads * D]` where `FLAT`, read strided); lane `i` holds dims
/// `lane + 32 i`, so the rotation's partner of dim `d < R / 2`, `d + R /
/// 2`, is the same lane's element `i + R / 64` (or, where `R` is 32, lane
/// `d + 16`'s first). `FREQS` (0 or 1) is
/// prepended. Template constants: `HQ`, `HK` heads, `D` the head dim (a
/// multiple of 64, at most 256) and `R` the rotated dims (32 or a multiple
/// of 64, at most `D`), `EPS_BITS`, `SCALE_BITS`, `LOG2BASE_BITS`.
pub(crate) const SOURCE: &str = r#"
    constexpr int HALF = R / 2;
    constexpr int E = D / 32;
    constexpr int P = R / 64;
    const int lane = threadIdx.x & 31;
    const int gw = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int B = q_shape[0], L = q_shape[1];
    if (gw >= B * L * (HQ + HK)) return;
    const int head = gw % (HQ + HK);
    const int bl = gw / (HQ + HK);
    const int b = bl / L, l = bl % L;
    const bool is_q = head < HQ;
    const int h = is_q ? head : head - HQ;
    // FLAT: `[B, L, heads * D]`, head h at dims h * D; else `[B, L, heads, D]`.
    const size_t step = is_q ? q_strides[FLAT ? 2 : 3] : k_strides[FLAT ? 2 : 3];
    const size_t head_step = FLAT ? (size_t)D * step : (size_t)(is_q ? q_strides[2] : k_strides[2]);
    const __nv_bfloat16* src = is_q
        ? q + (size_t)b * q_strides[0] + (size_t)l * q_strides[1] + h * head_step
        : k + (size_t)b * k_strides[0] + (size_t)l * k_strides[1] + h * head_step;
    const __nv_bfloat16* w = is_q ? gq : gk;
    __nv_bfloat16* dst = is_q ? qo + (((size_t)b * HQ + h) * L + l) * D : ko + (((size_t)b * HK + h) * L + l) * D;
    float x[E];
    #pragma unroll
    for (int i = 0; i < E; ++i) x[i] = __bfloat162float(src[(lane + 32 * i) * step]);
    float s = 0.f;
    #pragma unroll
    for (int i = 0; i < E; ++i) s += x[i] * x[i];
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffff, s, off);
    const float inv = rsqrtf(s / D + __int_as_float(EPS_BITS));
    #pragma unroll
    for (int i = 0; i < E; ++i) {
        const float y = __bfloat162float(__float2bfloat16(x[i] * inv));
        x[i] = __bfloat162float(__float2bfloat16(__bfloat162float(w[lane + 32 * i]) * y));
    }
    const float p = __int_as_float(SCALE_BITS) * (float)(offset[offset_shape[0] > 1 ? b : 0] + l);
    // The rotation of dim d < HALF and its partner d + HALF: cos, sin.
    const auto turn = [&](int d, float& c, float& sn) {
#if FREQS
        const float inv_freq = 1.0f / freqs[d];
#else
        const float inv_freq = exp2(-((float)d / (float)HALF) * __int_as_float(LOG2BASE_BITS));
#endif
        const float theta = p * inv_freq;
        c = cos(theta);
        sn = sin(theta);
    };
    #pragma unroll
    for (int i = 0; i < P; ++i) {
        const int d = lane + 32 * i;
        float c, sn;
        turn(d, c, sn);
        const float x1 = x[i], x2 = x[i + P];
        dst[d] = __float2bfloat16(x1 * c - x2 * sn);
        dst[d + HALF] = __float2bfloat16(x1 * sn + x2 * c);
    }
    if constexpr (R == 32) {
        // The partner of dim d < 16 is lane d + 16's first element.
        const float other = __shfl_xor_sync(0xffffffff, x[0], 16);
        float c, sn;
        turn(lane & 15, c, sn);
        dst[lane] = __float2bfloat16(lane < 16 ? x[0] * c - other * sn : other * sn + x[0] * c);
    }
    constexpr int ROTATED = R == 32 ? 1 : 2 * P;
    #pragma unroll
    for (int i = ROTATED; i < E; ++i) dst[lane + 32 * i] = __float2bfloat16(x[i]);
"#;

fn kernel(freqs: bool) -> Result<&'static CudaKernel> {
    static CELLS: [Cached; 2] = [const { Cached::new() }; 2];
    let (name, ins): (&str, &[&str]) = if freqs {
        ("qk_norm_rope_freqs", &["q", "k", "gq", "gk", "offset", "freqs"])
    } else {
        ("qk_norm_rope", &["q", "k", "gq", "gk", "offset"])
    };
    cached(&CELLS[usize::from(freqs)], || {
        let src = format!("#define FREQS {}\n{SOURCE}", u8::from(freqs));
        CudaKernel::new(name, ins, &["qo", "ko"], &src)
    })
}

/// `(rope(q_norm(q)), rope(k_norm(k)))` transposed to `[B, heads, L, D]`
/// from the projections `q [B, L, heads * D]` and `k [B, L, kv_heads * D]`,
/// or `None` where the fused route does not take them (`fused_heads`).
pub fn fused(
    q: &Array,
    k: &Array,
    norms: (&RmsNorm, &RmsNorm),
    rope: &Rope,
    pos: &Position,
    heads: (i32, i32),
) -> Result<Option<(Array, Array)>> {
    let (qs, ks) = (q.shape(), k.shape());
    let (&[b, l, qw], &[_, _, _]) = (qs, ks) else { return Ok(None) };
    if qw % heads.0 != 0 || ks != [b, l, heads.1 * (qw / heads.0)] {
        return Ok(None);
    }
    launch(q, k, Heads { b, l, q: heads.0, k: heads.1, d: qw / heads.0, flat: true }, norms, rope, pos)
}

/// The same from `q [B, L, heads, D]` and `k [B, L, kv_heads, D]`, views
/// of any strides (a gated attention's half of each query head), or `None`
/// where the fused route does not take them (not a GPU, not bf16, a head
/// dim past 256 or not a multiple of 64, rotated dims other than 32 or a
/// multiple of 64, a traditional rotation).
pub fn fused_heads(
    q: &Array,
    k: &Array,
    norms: (&RmsNorm, &RmsNorm),
    rope: &Rope,
    pos: &Position,
) -> Result<Option<(Array, Array)>> {
    let (qs, ks) = (q.shape(), k.shape());
    let (&[b, l, hq, d], &[_, _, hk, _]) = (qs, ks) else { return Ok(None) };
    if ks != [b, l, hk, d] {
        return Ok(None);
    }
    launch(q, k, Heads { b, l, q: hq, k: hk, d, flat: false }, norms, rope, pos)
}

/// Rows, tokens, query and K/V heads, head dim; whether the heads are
/// flattened into the last axis.
struct Heads {
    b: i32,
    l: i32,
    q: i32,
    k: i32,
    d: i32,
    flat: bool,
}

fn launch(
    q: &Array,
    k: &Array,
    Heads { b, l, q: hq, k: hk, d, flat }: Heads,
    norms: (&RmsNorm, &RmsNorm),
    rope: &Rope,
    pos: &Position,
) -> Result<Option<(Array, Array)>> {
    let Some(r) = rope.plain_parts(d) else { return Ok(None) };
    let (gq, eps_q) = norms.0.parts();
    let (gk, eps_k) = norms.1.parts();
    if !routes::current().fused_gemv
        || q.dtype() != Dtype::Bfloat16
        || k.dtype() != Dtype::Bfloat16
        || gq.dtype() != Dtype::Bfloat16
        || gk.dtype() != Dtype::Bfloat16
        || eps_q != eps_k
        || d % 64 != 0
        || d > 256
        || (r.dims % 64 != 0 && r.dims != 32)
        || gq.shape() != [d]
        || gk.shape() != [d]
        || !ops::on_gpu()
    {
        return Ok(None);
    }
    let offset = match pos {
        Position::Offset(o) => Array::from_slice(&[*o], &[1]),
        Position::PerRow(a) => a.as_dtype(Dtype::Int32)?,
    };
    let mut inputs = vec![q, k, gq, gk, &offset];
    if let Some(f) = r.freqs {
        inputs.push(f);
    }
    let warps = b * l * (hq + hk);
    let out = kernel(r.freqs.is_some())?.apply(
        &inputs,
        &Launch {
            grid: [warps * 32, 1, 1],
            threads: [128, 1, 1],
            outputs: &[(&[b, hq, l, d], Dtype::Bfloat16), (&[b, hk, l, d], Dtype::Bfloat16)],
            template: &[
                Template::Int("HQ", hq),
                Template::Int("HK", hk),
                Template::Int("D", d),
                Template::Int("R", r.dims),
                Template::Bool("FLAT", flat),
                Template::Int("EPS_BITS", eps_q.to_bits() as i32),
                Template::Int("SCALE_BITS", r.scale.to_bits() as i32),
                Template::Int("LOG2BASE_BITS", r.base.map_or(0.0, f32::log2).to_bits() as i32),
            ],
        },
    )?;
    let mut it = out.into_iter();
    Ok(Some((it.next().expect("two outputs"), it.next().expect("two outputs"))))
}
