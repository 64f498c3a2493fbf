//! Per-head RMSNorm of the queries and keys, then RoPE, as one kernel on a
//! GPU decode step (Qwen3's `q_norm`/`k_norm` before the rotation): the
//! separate route is a reshape, a norm, a transpose and a rotation for each
//! of q and k, eight graph nodes a layer the host builds and launches.
//! Output is `[B, heads, L, D]`, what attention takes.
//!
//! Numerics follow MLX's kernels: the norm writes `w * T(x * normalizer)`
//! rounded to bf16, the rotation computes in float32 from the rounded input
//! with `inv_freq = 2^(-d / (D / 2) * log2(base))` (or `1 / freqs[d]`) and
//! rounds once.

use crate::cuda_kernel::{cached, Cached, CudaKernel, Launch, Template};
use crate::layers::RmsNorm;
use crate::rope::{Position, Rope};
use crate::{ops, routes, Array, Dtype, Result};

/// One warp per (row, token, head); each lane holds dims `lane`,
/// `lane + 32` and their rotation partners `+ D / 2`. `FREQS` (0 or 1) is
/// prepended. Template constants: `HQ`, `HK` heads, `D` the head dim (128),
/// `EPS_BITS`, `SCALE_BITS`, `LOG2BASE_BITS`.
const SOURCE: &str = r#"
    constexpr int HALF = D / 2;
    const int lane = threadIdx.x & 31;
    const int gw = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int B = q_shape[0], L = q_shape[1];
    if (gw >= B * L * (HQ + HK)) return;
    const int head = gw % (HQ + HK);
    const int bl = gw / (HQ + HK);
    const int b = bl / L, l = bl % L;
    const bool is_q = head < HQ;
    const int h = is_q ? head : head - HQ;
    const __nv_bfloat16* src = is_q ? q + ((size_t)bl * HQ + h) * D : k + ((size_t)bl * HK + h) * D;
    const __nv_bfloat16* w = is_q ? gq : gk;
    __nv_bfloat16* dst = is_q ? qo + (((size_t)b * HQ + h) * L + l) * D : ko + (((size_t)b * HK + h) * L + l) * D;
    float x[4];
    #pragma unroll
    for (int i = 0; i < 4; ++i) x[i] = __bfloat162float(src[lane + 32 * i]);
    float s = x[0] * x[0] + x[1] * x[1] + x[2] * x[2] + x[3] * x[3];
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffff, s, off);
    const float inv = rsqrtf(s / D + __int_as_float(EPS_BITS));
    #pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float y = __bfloat162float(__float2bfloat16(x[i] * inv));
        x[i] = __bfloat162float(__float2bfloat16(__bfloat162float(w[lane + 32 * i]) * y));
    }
    const float p = __int_as_float(SCALE_BITS) * (float)(offset[offset_shape[0] > 1 ? b : 0] + l);
    #pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int d = lane + 32 * i;
#if FREQS
        const float inv_freq = 1.0f / freqs[d];
#else
        const float inv_freq = exp2(-((float)d / (float)HALF) * __int_as_float(LOG2BASE_BITS));
#endif
        const float theta = p * inv_freq;
        const float c = cos(theta), sn = sin(theta);
        const float x1 = x[i], x2 = x[i + 2];
        dst[d] = __float2bfloat16(x1 * c - x2 * sn);
        dst[d + HALF] = __float2bfloat16(x1 * sn + x2 * c);
    }
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
        CudaKernel::new_contiguous(name, ins, &["qo", "ko"], &src)
    })
}

/// `(rope(q_norm(q)), rope(k_norm(k)))` transposed to `[B, heads, L, D]`
/// from the projections `q [B, L, heads * D]` and `k [B, L, kv_heads * D]`,
/// or `None` where the fused route does not take them (not a GPU, not
/// bf16, a head dim other than 128, a partial or traditional rotation).
pub fn fused(
    q: &Array,
    k: &Array,
    norms: (&RmsNorm, &RmsNorm),
    rope: &Rope,
    pos: &Position,
    heads: (i32, i32),
) -> Result<Option<(Array, Array)>> {
    const D: i32 = 128;
    let Some(r) = rope.plain_parts(D) else { return Ok(None) };
    let (qs, ks) = (q.shape(), k.shape());
    let (gq, eps_q) = norms.0.parts();
    let (gk, eps_k) = norms.1.parts();
    if !routes::current().fused_gemv
        || q.dtype() != Dtype::Bfloat16
        || k.dtype() != Dtype::Bfloat16
        || gq.dtype() != Dtype::Bfloat16
        || gk.dtype() != Dtype::Bfloat16
        || eps_q != eps_k
        || qs.len() != 3
        || qs[2] != heads.0 * D
        || ks[2] != heads.1 * D
        || gq.shape() != [D]
        || !ops::on_gpu()
    {
        return Ok(None);
    }
    let (b, l) = (qs[0], qs[1]);
    let offset = match pos {
        Position::Offset(o) => Array::from_slice(&[*o], &[1]),
        Position::PerRow(a) => a.as_dtype(Dtype::Int32)?,
    };
    let mut inputs = vec![q, k, gq, gk, &offset];
    if let Some(f) = r.freqs {
        inputs.push(f);
    }
    let warps = b * l * (heads.0 + heads.1);
    let out = kernel(r.freqs.is_some())?.apply(
        &inputs,
        &Launch {
            grid: [warps * 32, 1, 1],
            threads: [128, 1, 1],
            outputs: &[(&[b, heads.0, l, D], Dtype::Bfloat16), (&[b, heads.1, l, D], Dtype::Bfloat16)],
            template: &[
                Template::Int("HQ", heads.0),
                Template::Int("HK", heads.1),
                Template::Int("D", D),
                Template::Int("EPS_BITS", eps_q.to_bits() as i32),
                Template::Int("SCALE_BITS", r.scale.to_bits() as i32),
                Template::Int("LOG2BASE_BITS", r.base.map_or(0.0, f32::log2).to_bits() as i32),
            ],
        },
    )?;
    let mut it = out.into_iter();
    Ok(Some((it.next().expect("two outputs"), it.next().expect("two outputs"))))
}
