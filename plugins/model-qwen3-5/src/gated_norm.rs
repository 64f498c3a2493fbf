//! `Qwen3NextRMSNormGated` on the GPU in one CUDA kernel of our own
//! (`delta::DeltaNet::gated_norm` is the ops route: MLX's `rms_norm`, two
//! casts to float32, the compiled SiLU, the product and the cast back, six
//! launches a DeltaNet layer).
//!
//! One warp per (row, token, value head): the sum of squares over the value
//! dimension is a warp shuffle. The arithmetic is the ops route's per
//! element: MLX's norm `w * T(y * normalizer)` in the model's dtype `T`,
//! the SiLU of the gate and the product in float32 (MLX's `Sigmoid`), one
//! rounding back to T.

use model_kit::cuda_kernel::{cached, Cached, CudaKernel, Launch, Template};
use model_kit::{Array, Result};

/// Template constant: `EPS_BITS`, the norm's eps as float32 bits.
const SOURCE: &str = r#"
    using T = cuda::std::remove_const_t<cuda::std::remove_pointer_t<decltype(y)>>;
    const int lane = threadIdx.x & 31;
    const size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const size_t rows = (size_t)y_shape[0] * y_shape[1] * y_shape[2];
    if (row >= rows) return;
    const int DV = y_shape[3];
    const T* yr = y + row * DV;
    const T* zr = z + row * DV;
    float ss = 0.f;
    for (int i = lane; i < DV; i += 32) {
        const float x = static_cast<float>(yr[i]);
        ss += x * x;
    }
    for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
    const float inv = rsqrtf(ss / DV + __int_as_float(EPS_BITS));
    for (int i = lane; i < DV; i += 32) {
        const float normed = static_cast<float>(w[i] * static_cast<T>(static_cast<float>(yr[i]) * inv));
        const float x = static_cast<float>(zr[i]);
        const float sg = 1.f / (1.f + expf(fabsf(x)));
        const float gate = x * (x < 0.f ? sg : 1.f - sg);
        out[row * DV + i] = static_cast<T>(gate * normed);
    }
"#;

fn kernel() -> Result<&'static CudaKernel> {
    static KERNEL: Cached = Cached::new();
    cached(&KERNEL, || CudaKernel::new_contiguous("gated_rms_norm", &["y", "z", "w"], &["out"], SOURCE))
}

/// `rms_norm(y, w, eps) * silu(z)` `[B, T, Hv * Dv]` from `y` and `z`
/// `[B, T, Hv, Dv]` and `w` `[Dv]`, all of one dtype; None for shapes or
/// dtypes it does not take (the caller takes the ops route).
pub fn fused(y: &Array, z: &Array, w: &Array, eps: f32) -> Result<Option<Array>> {
    let &[b, t, hv, dv] = y.shape() else { return Ok(None) };
    let dt = y.dtype();
    if z.shape() != y.shape() || z.dtype() != dt || w.shape() != [dv] || w.dtype() != dt || b * t * hv == 0 {
        return Ok(None);
    }
    let rows = b * t * hv;
    let out = kernel()?.apply(
        &[y, z, w],
        &Launch {
            grid: [rows * 32, 1, 1],
            threads: [128, 1, 1],
            outputs: &[(&[b, t, hv * dv], dt)],
            template: &[Template::Int("EPS_BITS", eps.to_bits() as i32)],
        },
    )?;
    Ok(out.into_iter().next())
}

#[cfg(test)]
mod tests {
    use super::*;
    use model_kit::cuda_capture::launches;
    use model_kit::kernel_check::{assert_compiles, kernels};
    use model_kit::ops::zeros;
    use model_kit::Dtype;

    /// The kernel compiles for the H200 at the DeltaNet's launches (a
    /// decode step, a verify, a prompt; Qwen3.5's 32 value heads of 128 in
    /// bf16, a small float32 shape) and refuses a weight of another dtype.
    #[test]
    fn the_gated_norm_kernel_compiles_for_the_h200() {
        let recorded = launches(|| -> Result<()> {
            for (hv, dv, dtype) in [(32, 128, Dtype::Bfloat16), (4, 64, Dtype::Float32)] {
                for (b, t) in [(1, 1), (1, 3), (2, 40)] {
                    let y = zeros(&[b, t, hv, dv], dtype)?;
                    let out = fused(&y, &y, &zeros(&[dv], dtype)?, 1e-6)?.expect("the kernel takes it");
                    assert_eq!(out.shape(), [b, t, hv * dv]);
                }
            }
            let y = zeros(&[1, 1, 4, 64], Dtype::Bfloat16)?;
            assert!(fused(&y, &y, &zeros(&[64], Dtype::Float32)?, 1e-6)?.is_none(), "a float32 weight");
            Ok(())
        })
        .unwrap();
        assert_eq!(kernels(&recorded), ["gated_rms_norm"]);
        assert_compiles(&recorded);
    }
}
