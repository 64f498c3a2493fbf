//! The depthwise conv on the GPU in one CUDA kernel of our own, reading
//! the window in place: the compiled route (`DepthwiseConv::fused`) takes
//! the window's K shifted views, and MLX's compile leaves two of their
//! casts to float32 and the taps' broadcasts outside its fused kernel, a
//! dozen graph nodes and three launches a layer that the host builds and
//! launches every step.
//!
//! Numerics are the compiled route's: the taps sum in float32 in tap order
//! from the first (`tap_sum`), rounded once to the window's dtype.

use crate::cuda_kernel::{cached, Cached, CudaKernel, Launch};
use crate::{Array, Dtype, Result};

/// One thread per (row, position, channel) of `out` (`[B, L, C]`,
/// row-major); `window` `[B, K - 1 + L, C]` and `taps` `[C, K]` float32
/// read strided, `K` from the taps' shape.
pub(crate) const SOURCE: &str = r#"
    using T = cuda::std::remove_const_t<cuda::std::remove_pointer_t<decltype(window)>>;
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int B = window_shape[0], C = window_shape[2], K = taps_shape[1];
    const int L = window_shape[1] - K + 1;
    if (i >= (size_t)B * L * C) return;
    const int c = i % C;
    const size_t bl = i / C;
    const int l = bl % L, b = bl / L;
    const T* x = window + (size_t)b * window_strides[0] + (size_t)l * window_strides[1] + (size_t)c * window_strides[2];
    const float* w = taps + (size_t)c * taps_strides[0];
    float acc = static_cast<float>(x[0]) * w[0];
    for (int j = 1; j < K; ++j) acc += static_cast<float>(x[(size_t)j * window_strides[1]]) * w[(size_t)j * taps_strides[1]];
    out[i] = static_cast<T>(acc);
"#;

const THREADS: i32 = 256;

fn kernel() -> Result<&'static CudaKernel> {
    static KERNEL: Cached = Cached::new();
    cached(&KERNEL, || CudaKernel::new("depthwise_conv", &["window", "taps"], &["out"], SOURCE))
}

/// `conv(window)` `[B, L, C]` in the window's dtype, from `window`
/// `[B, K-1+L, C]` and `taps` `[C, K]` float32; None for what it does not
/// take (other ranks or dtypes, a window shorter than K, a launch past
/// 2^31 threads).
pub fn conv(window: &Array, taps: &Array) -> Result<Option<Array>> {
    let (&[b, w, c], &[tc, k]) = (window.shape(), taps.shape()) else { return Ok(None) };
    let dt = window.dtype();
    let float = matches!(dt, Dtype::Bfloat16 | Dtype::Float16 | Dtype::Float32);
    if tc != c || taps.dtype() != Dtype::Float32 || !float || w < k || k < 1 {
        return Ok(None);
    }
    let l = w - k + 1;
    let Ok(total) = i32::try_from(b as i64 * l as i64 * c as i64) else { return Ok(None) };
    let out = kernel()?.apply(
        &[window, taps],
        &Launch {
            grid: [(total + THREADS - 1) / THREADS * THREADS, 1, 1],
            threads: [THREADS, 1, 1],
            outputs: &[(&[b, l, c], dt)],
            template: &[],
        },
    )?;
    Ok(out.into_iter().next())
}
