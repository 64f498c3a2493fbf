//! The gated DeltaNet's core on the GPU: one CUDA kernel of our own
//! (model-kit's `cuda_kernel`) per layer and call takes the conv's q/k/v
//! and the raw `b`/`a` projections to the output and the new state: the
//! RMS norms and scales of q and k (`delta::normalize_qk`), `beta =
//! sigmoid(b)`, the decay (`delta::compute_g`) and the recurrence over
//! every token. The ops route launches those as six more kernels a layer
//! (two norms, two scalings, the sigmoid, the decay) and, for the
//! recurrence, a compiled step with five sliced inputs per token. A decode
//! step, a speculative verify of a few positions and a prompt's prefill all
//! become one launch per layer.
//!
//! One warp per (row, value head, value dimension): each lane keeps
//! `ceil(DK / 32)` of the state's key columns for that value dimension in
//! float32 registers, and the reductions over the key dimension (the norms
//! of q and k, what the state predicts for k, the readout along q) are warp
//! shuffles. With `ALL` the kernel also writes the state after every token
//! (a speculative round's rollback picks one instead of a replay).
//! The arithmetic is the ops route's, in the same order per element, with
//! every value the ops route holds in the model's dtype `T` rounded to it
//! at the same step (`rt`): MLX's `rms_norm`, `sigmoid` and `logaddexp` in
//! T, the decay and the recurrence in float32. Only the order of the sums
//! over the key dimension differs (docs/benchmarks.md, "The gated DeltaNet
//! on the GPU").

use crate::recurrence::{QkNorm, Recurrence};
use model_kit::cuda_kernel::{cached, Cached, CudaKernel, Launch, Template};
use model_kit::{error, Array, Dtype, Result};

/// Template constants: `DK`, `HAS_MASK`, `ALL`, and as float32 bits the
/// norms' `EPS_BITS` and the scales `QS_BITS`, `KS_BITS` (rounded to T in
/// the kernel, as `delta::normalize_qk`'s scalars are).
const SOURCE: &str = r#"
    using T = cuda::std::remove_const_t<cuda::std::remove_pointer_t<decltype(q)>>;
    // A float32 value rounded to T, as an op whose output is T rounds it.
    auto rt = [](float x) { return static_cast<float>(static_cast<T>(x)); };
    constexpr int NP = (DK + 31) / 32;
    const int lane = threadIdx.x;
    const int dv = blockIdx.y * blockDim.y + threadIdx.y;
    const int T_LEN = v_shape[1];
    const int HV = v_shape[2];
    const int DV = v_shape[3];
    const int HK = q_shape[2];
    const int b = blockIdx.z / HV;
    const int hv = blockIdx.z % HV;
    const int hk = hv / (HV / HK);
    if (dv >= DV) return;
    const float eps = __int_as_float(EPS_BITS);
    const float q_scale = rt(__int_as_float(QS_BITS));
    const float k_scale = rt(__int_as_float(KS_BITS));
    // compute_g's per-head parts: -exp(A_log) in float32, dt_bias in T.
    const float rate = -expf(a_log[(size_t)hv * a_log_strides[0]]);
    const float dtb = static_cast<float>(dt_bias[(size_t)hv * dt_bias_strides[0]]);
    const size_t sb = (size_t)b * state_strides[0] + (size_t)hv * state_strides[1] + (size_t)dv * state_strides[2];
    float s[NP];
    for (int j = 0; j < NP; ++j) {
        const int i = lane + 32 * j;
        s[j] = i < DK ? static_cast<float>(state[sb + (size_t)i * state_strides[3]]) : 0.f;
    }
    for (int t = 0; t < T_LEN; ++t) {
        const size_t qb = (size_t)b * q_strides[0] + (size_t)t * q_strides[1] + (size_t)hk * q_strides[2];
        const size_t kb = (size_t)b * k_strides[0] + (size_t)t * k_strides[1] + (size_t)hk * k_strides[2];
        // normalize_qk: rms_norm in T (MLX's kernel: x * rsqrt(mean(x^2) + eps), rounded), then the scale in T.
        float qn[NP], kn[NP];
        float qss = 0.f, kss = 0.f;
        for (int j = 0; j < NP; ++j) {
            const int i = lane + 32 * j;
            qn[j] = i < DK ? static_cast<float>(q[qb + (size_t)i * q_strides[3]]) : 0.f;
            kn[j] = i < DK ? static_cast<float>(k[kb + (size_t)i * k_strides[3]]) : 0.f;
            qss += qn[j] * qn[j];
            kss += kn[j] * kn[j];
        }
        for (int off = 16; off > 0; off >>= 1) {
            qss += __shfl_xor_sync(0xffffffffu, qss, off);
            kss += __shfl_xor_sync(0xffffffffu, kss, off);
        }
        const float qinv = rsqrtf(qss / DK + eps);
        const float kinv = rsqrtf(kss / DK + eps);
        for (int j = 0; j < NP; ++j) {
            qn[j] = rt(q_scale * rt(qn[j] * qinv));
            kn[j] = rt(k_scale * rt(kn[j] * kinv));
        }
        // beta = sigmoid(b), MLX's Sigmoid in T.
        const float bx = static_cast<float>(b_in[(size_t)b * b_in_strides[0] + (size_t)t * b_in_strides[1] + (size_t)hv * b_in_strides[2]]);
        const float sg = rt(1.f / rt(1.f + rt(expf(fabsf(bx)))));
        const float bt = bx < 0.f ? sg : rt(1.f - sg);
        // compute_g: exp(-exp(A_log) * softplus(a + dt_bias)), softplus =
        // MLX's logaddexp(x, 0) in T.
        const float x = rt(static_cast<float>(a_in[(size_t)b * a_in_strides[0] + (size_t)t * a_in_strides[1] + (size_t)hv * a_in_strides[2]]) + dtb);
        const float hi = fmaxf(x, 0.f), lo = fminf(x, 0.f);
        const float sp = isinf(hi) ? hi : rt(hi + rt(log1pf(rt(expf(rt(lo - hi))))));
        const float gt = expf(rate * sp);
        const float vt = static_cast<float>(v[(size_t)b * v_strides[0] + (size_t)t * v_strides[1] + (size_t)hv * v_strides[2] + (size_t)dv * v_strides[3]]);
        const bool keep = !HAS_MASK || mask[(size_t)b * mask_strides[0] + (size_t)t * mask_strides[1]];
        float old[NP];
        float kv = 0.f;
        for (int j = 0; j < NP; ++j) {
            const int i = lane + 32 * j;
            old[j] = s[j];
            if (i < DK) {
                s[j] = s[j] * gt;
                kv += s[j] * kn[j];
            }
        }
        for (int off = 16; off > 0; off >>= 1) kv += __shfl_xor_sync(0xffffffffu, kv, off);
        const float delta = (vt - kv) * bt;
        float yv = 0.f;
        for (int j = 0; j < NP; ++j) {
            const int i = lane + 32 * j;
            if (i < DK) {
                s[j] = s[j] + kn[j] * delta;
                yv += s[j] * qn[j];
            }
        }
        for (int off = 16; off > 0; off >>= 1) yv += __shfl_xor_sync(0xffffffffu, yv, off);
        if (lane == 0) {
            y[(((size_t)b * T_LEN + t) * HV + hv) * DV + dv] = static_cast<T>(yv);
        }
        if (!keep) {
            for (int j = 0; j < NP; ++j) s[j] = old[j];
        }
        if constexpr (ALL) {
            const size_t at = ((((size_t)b * T_LEN + t) * HV + hv) * DV + dv) * DK;
            for (int j = 0; j < NP; ++j) {
                const int i = lane + 32 * j;
                if (i < DK) states[at + i] = s[j];
            }
        }
    }
    const size_t ob = (((size_t)b * HV + hv) * DV + dv) * DK;
    for (int j = 0; j < NP; ++j) {
        const int i = lane + 32 * j;
        if (i < DK) state_out[ob + i] = s[j];
    }
"#;

fn kernel() -> Result<&'static CudaKernel> {
    static KERNEL: Cached = Cached::new();
    cached(&KERNEL, || {
        CudaKernel::new(
            "gated_delta_core",
            &["q", "k", "v", "b_in", "a_in", "a_log", "dt_bias", "state", "mask"],
            &["y", "state_out", "states"],
            SOURCE,
        )
    })
}

/// A call's gate inputs and the layer's decay parameters: `b` and `a`
/// `[B, T, Hv]` the raw `in_proj_b` / `in_proj_a` outputs, `a_log` `[Hv]`
/// float32, `dt_bias` `[Hv]`.
pub struct Gates<'a> {
    pub b: &'a Array,
    pub a: &'a Array,
    pub a_log: &'a Array,
    pub dt_bias: &'a Array,
}

/// The core over all `T` tokens: `q`/`k` `[B, T, Hk, Dk]` as the conv
/// gives them (not normed, not repeated to the value heads), `v` `[B, T,
/// Hv, Dv]`, the gates, `state` `[B, Hv, Dv, Dk]` float32, `mask` a bool
/// `[B, T]` (false = padding: the row keeps its state); `every` keeps the
/// state after each token too. None for shapes or dtypes the kernel was not
/// built for (the caller takes the ops route).
pub fn core(
    (q, k, v): (&Array, &Array, &Array),
    gates: &Gates,
    state: &Array,
    mask: Option<&Array>,
    every: bool,
) -> Result<Option<Recurrence>> {
    let (&[b, t, hk, dk], &[_, _, hv, dv]) = (q.shape(), v.shape()) else { return Ok(None) };
    let dt = q.dtype();
    let fits = hk > 0
        && hv % hk == 0
        && k.shape() == q.shape()
        && v.shape()[..2] == [b, t]
        && gates.b.shape() == [b, t, hv]
        && gates.a.shape() == [b, t, hv]
        && gates.a_log.shape() == [hv]
        && gates.dt_bias.shape() == [hv]
        && [k.dtype(), gates.b.dtype(), gates.a.dtype(), gates.dt_bias.dtype()].iter().all(|&d| d == dt)
        && matches!(dt, Dtype::Bfloat16 | Dtype::Float16 | Dtype::Float32)
        && gates.a_log.dtype() == Dtype::Float32
        && state.shape() == [b, hv, dv, dk]
        && state.dtype() == Dtype::Float32
        && (1..=256).contains(&dk)
        && b * hv <= 65535 // CUDA's limit on a grid's third axis
        && t > 0;
    if !fits {
        return Ok(None);
    }
    let norm = QkNorm::of(dk as usize);
    let no_mask = Array::from_slice(&[true], &[1]);
    let all_shape = [b, t, hv, dv, dk];
    let per_block = if dv % 4 == 0 { 4 } else { 1 };
    let outs = kernel()?.apply(
        &[q, k, v, gates.b, gates.a, gates.a_log, gates.dt_bias, state, mask.unwrap_or(&no_mask)],
        &Launch {
            grid: [32, dv, b * hv],
            threads: [32, per_block, 1],
            outputs: &[
                (&[b, t, hv, dv], dt),
                (&[b, hv, dv, dk], Dtype::Float32),
                // Unwritten (one element) unless every state is kept.
                (if every { &all_shape[..] } else { &[1] }, Dtype::Float32),
            ],
            template: &[
                Template::Int("DK", dk),
                Template::Bool("HAS_MASK", mask.is_some()),
                Template::Bool("ALL", every),
                Template::Int("EPS_BITS", norm.eps.to_bits() as i32),
                Template::Int("QS_BITS", (norm.q_scale as f32).to_bits() as i32),
                Template::Int("KS_BITS", (norm.k_scale as f32).to_bits() as i32),
            ],
        },
    )?;
    let [y, state, states]: [Array; 3] =
        outs.try_into().map_err(|_| error("the delta kernel returned other outputs"))?;
    Ok(Some(Recurrence { y, state, states: every.then_some(states) }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use model_kit::cuda_capture::launches;
    use model_kit::kernel_check::{assert_compiles, kernels};
    use model_kit::ops::zeros;

    /// The kernel compiles for the H200 (`model_kit::kernel_check`) at the
    /// launches the DeltaNet makes: Qwen3.5's 16 key heads over 32 value
    /// heads of 128 and a small 64-wide shape, bf16 or float32 (`A_log`
    /// float32 in both, as the checkpoint keeps it), a prompt with a
    /// padding mask and a decode step, with and without every position's
    /// state; gates whose dtypes differ from q's go to the ops route.
    #[test]
    fn the_delta_kernel_compiles_for_the_h200() {
        let recorded = launches(|| -> Result<()> {
            for (hk, hv, d, dtype) in [(16, 32, 128, Dtype::Bfloat16), (2, 4, 64, Dtype::Float32)] {
                for (b, t, mask, every) in [(2, 40, true, false), (1, 1, false, false), (1, 3, false, true)] {
                    let q = zeros(&[b, t, hk, d], dtype)?;
                    let v = zeros(&[b, t, hv, d], dtype)?;
                    let ba = zeros(&[b, t, hv], dtype)?;
                    let a_log = zeros(&[hv], Dtype::Float32)?;
                    let dt_bias = zeros(&[hv], dtype)?;
                    let state = zeros(&[b, hv, d, d], Dtype::Float32)?;
                    let mask = mask.then(|| zeros(&[b, t], Dtype::Bool)).transpose()?;
                    let gates = Gates { b: &ba, a: &ba, a_log: &a_log, dt_bias: &dt_bias };
                    let out = core((&q, &q, &v), &gates, &state, mask.as_ref(), every)?;
                    assert!(out.is_some(), "the kernel takes it");
                }
            }
            let q = zeros(&[1, 1, 2, 64], Dtype::Bfloat16)?;
            let v = zeros(&[1, 1, 4, 64], Dtype::Bfloat16)?;
            let ba = zeros(&[1, 1, 4], Dtype::Bfloat16)?;
            let f32_bias = zeros(&[4], Dtype::Float32)?;
            let state = zeros(&[1, 4, 64, 64], Dtype::Float32)?;
            let gates = Gates { b: &ba, a: &ba, a_log: &f32_bias, dt_bias: &f32_bias };
            assert!(core((&q, &q, &v), &gates, &state, None, false)?.is_none(), "a float32 dt_bias beside bf16 gates");
            Ok(())
        })
        .unwrap();
        assert_eq!(kernels(&recorded), ["gated_delta_core"]);
        assert_compiles(&recorded);
    }
}
