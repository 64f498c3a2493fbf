//! The gated delta recurrence on the GPU: every token of a call in one CUDA
//! kernel of our own (model-kit's `cuda_kernel`), where the ops route
//! (`delta::recurrence`) launches a compiled step and slices five inputs per
//! token and layer. A decode step, a speculative verify of a few positions
//! and a prompt's prefill all become one launch per layer.
//!
//! One warp per (row, value head, value dimension): each lane keeps
//! `ceil(DK / 32)` of the state's key columns for that value dimension in
//! float32 registers, and the two reductions over the key dimension (what
//! the state predicts for k, and the readout along q) are warp shuffles.
//! With `ALL` the kernel also writes the state after every token (a
//! speculative round's rollback picks one instead of a replay).
//! The arithmetic is the ops route's, in the same order per element, in
//! float32 with the inputs widened; only the order of the two sums over
//! the key dimension differs (docs/benchmarks.md, "The gated DeltaNet on
//! the GPU").

use crate::recurrence::Recurrence;
use model_kit::cuda_kernel::{cached, Cached, CudaKernel, Launch, Template};
use model_kit::{error, Array, Dtype, Result};

const SOURCE: &str = r#"
    constexpr int NP = (DK + 31) / 32;
    const int lane = threadIdx.x;
    const int dv = blockIdx.y * blockDim.y + threadIdx.y;
    const int T = v_shape[1];
    const int HV = v_shape[2];
    const int DV = v_shape[3];
    const int HK = q_shape[2];
    const int b = blockIdx.z / HV;
    const int hv = blockIdx.z % HV;
    const int hk = hv / (HV / HK);
    if (dv >= DV) return;
    const size_t sb = (size_t)b * state_strides[0] + (size_t)hv * state_strides[1] + (size_t)dv * state_strides[2];
    float s[NP];
    for (int j = 0; j < NP; ++j) {
        const int i = lane + 32 * j;
        s[j] = i < DK ? static_cast<float>(state[sb + (size_t)i * state_strides[3]]) : 0.f;
    }
    for (int t = 0; t < T; ++t) {
        const size_t qb = (size_t)b * q_strides[0] + (size_t)t * q_strides[1] + (size_t)hk * q_strides[2];
        const size_t kb = (size_t)b * k_strides[0] + (size_t)t * k_strides[1] + (size_t)hk * k_strides[2];
        const float gt = static_cast<float>(g[(size_t)b * g_strides[0] + (size_t)t * g_strides[1] + (size_t)hv * g_strides[2]]);
        const float bt = static_cast<float>(beta[(size_t)b * beta_strides[0] + (size_t)t * beta_strides[1] + (size_t)hv * beta_strides[2]]);
        const float vt = static_cast<float>(v[(size_t)b * v_strides[0] + (size_t)t * v_strides[1] + (size_t)hv * v_strides[2] + (size_t)dv * v_strides[3]]);
        const bool keep = !HAS_MASK || mask[(size_t)b * mask_strides[0] + (size_t)t * mask_strides[1]];
        float old[NP];
        float kv = 0.f;
        for (int j = 0; j < NP; ++j) {
            const int i = lane + 32 * j;
            old[j] = s[j];
            if (i < DK) {
                s[j] = s[j] * gt;
                kv += s[j] * static_cast<float>(k[kb + (size_t)i * k_strides[3]]);
            }
        }
        for (int off = 16; off > 0; off >>= 1) kv += __shfl_xor_sync(0xffffffffu, kv, off);
        const float delta = (vt - kv) * bt;
        float yv = 0.f;
        for (int j = 0; j < NP; ++j) {
            const int i = lane + 32 * j;
            if (i < DK) {
                s[j] = s[j] + static_cast<float>(k[kb + (size_t)i * k_strides[3]]) * delta;
                yv += s[j] * static_cast<float>(q[qb + (size_t)i * q_strides[3]]);
            }
        }
        for (int off = 16; off > 0; off >>= 1) yv += __shfl_xor_sync(0xffffffffu, yv, off);
        if (lane == 0) {
            y[(((size_t)b * T + t) * HV + hv) * DV + dv] = yv;  // rounded to y's dtype by its constructor
        }
        if (!keep) {
            for (int j = 0; j < NP; ++j) s[j] = old[j];
        }
        if constexpr (ALL) {
            const size_t at = ((((size_t)b * T + t) * HV + hv) * DV + dv) * DK;
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
            "gated_delta_recurrence",
            &["q", "k", "v", "g", "beta", "state", "mask"],
            &["y", "state_out", "states"],
            SOURCE,
        )
    })
}

/// The recurrence over all `T` tokens: `q`/`k` `[B, T, Hk, Dk]` (not yet
/// repeated to the value heads), `v` `[B, T, Hv, Dv]`, `g` and `beta`
/// `[B, T, Hv]`, `state` `[B, Hv, Dv, Dk]` float32, `mask` a bool `[B, T]`
/// (false = padding: the row keeps its state); `every` keeps the state
/// after each token too. None for shapes the kernel was not built for (the
/// caller takes the ops route).
#[allow(clippy::too_many_arguments)]
pub fn recurrence(
    q: &Array,
    k: &Array,
    v: &Array,
    g: &Array,
    beta: &Array,
    state: &Array,
    mask: Option<&Array>,
    every: bool,
) -> Result<Option<Recurrence>> {
    let (&[b, t, hk, dk], &[_, _, hv, dv]) = (q.shape(), v.shape()) else { return Ok(None) };
    let fits = hk > 0
        && hv % hk == 0
        && k.shape() == q.shape()
        && v.shape()[..2] == [b, t]
        && g.shape() == [b, t, hv]
        && beta.shape() == [b, t, hv]
        && state.shape() == [b, hv, dv, dk]
        && state.dtype() == Dtype::Float32
        && (1..=256).contains(&dk)
        && b * hv <= 65535 // CUDA's limit on a grid's third axis
        && t > 0;
    if !fits {
        return Ok(None);
    }
    let no_mask = Array::from_slice(&[true], &[1]);
    let all_shape = [b, t, hv, dv, dk];
    let per_block = if dv % 4 == 0 { 4 } else { 1 };
    let outs = kernel()?.apply(
        &[q, k, v, g, beta, state, mask.unwrap_or(&no_mask)],
        &Launch {
            grid: [32, dv, b * hv],
            threads: [32, per_block, 1],
            outputs: &[
                (&[b, t, hv, dv], q.dtype()),
                (&[b, hv, dv, dk], Dtype::Float32),
                // Unwritten (one element) unless every state is kept.
                (if every { &all_shape[..] } else { &[1] }, Dtype::Float32),
            ],
            template: &[
                Template::Int("DK", dk),
                Template::Bool("HAS_MASK", mask.is_some()),
                Template::Bool("ALL", every),
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
    /// heads of 128 and a small 64-wide shape, bf16 projections (decay in
    /// float32, as `compute_g` gives it) or all float32, a prompt with a
    /// padding mask and a decode step, with and without every position's
    /// state.
    #[test]
    fn the_delta_kernel_compiles_for_the_h200() {
        let recorded = launches(|| -> Result<()> {
            for (hk, hv, d, dtype) in [(16, 32, 128, Dtype::Bfloat16), (2, 4, 64, Dtype::Float32)] {
                for (b, t, mask, every) in [(2, 40, true, false), (1, 1, false, false), (1, 3, false, true)] {
                    let q = zeros(&[b, t, hk, d], dtype)?;
                    let v = zeros(&[b, t, hv, d], dtype)?;
                    let g = zeros(&[b, t, hv], Dtype::Float32)?;
                    let beta = zeros(&[b, t, hv], dtype)?;
                    let state = zeros(&[b, hv, d, d], Dtype::Float32)?;
                    let mask = mask.then(|| zeros(&[b, t], Dtype::Bool)).transpose()?;
                    let out = recurrence(&q, &q, &v, &g, &beta, &state, mask.as_ref(), every)?;
                    assert!(out.is_some(), "the kernel takes it");
                }
            }
            Ok(())
        })
        .unwrap();
        assert_eq!(kernels(&recorded), ["gated_delta_recurrence"]);
        assert_compiles(&recorded);
    }
}
