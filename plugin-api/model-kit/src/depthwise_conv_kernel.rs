//! The depthwise conv + SiLU on the GPU in one CUDA kernel of our own,
//! written straight into three groups of heads (a linear-attention layer's
//! q, k and v): the compiled route (`DepthwiseConv::forward_silu`) is the
//! window's K shifted views, two casts MLX's compile leaves outside its
//! fused kernel, the fused kernel, then a split and three reshapes, a dozen
//! graph nodes a layer that the host builds and launches every step.
//!
//! Numerics: the taps sum in float32 in tap order from the first (as the
//! compiled route's `tap_sum`), rounded once to the window's dtype `T`;
//! SiLU of that in float32, rounded once.

use crate::cuda_kernel::{cached, Cached, CudaKernel, Launch, Template};
use crate::{Array, Dtype, Result};

/// One thread per (row, position, channel) of the output; `window` `[B, K -
/// 1 + L, C]` and `taps` `[C, K]` float32 read strided. Channels `[0, S1)`
/// go to `first` `[B, L, S1]`, `[S1, S2)` to `second`, the rest to
/// `third`, each row-major. Template constants: `K`, `S1`, `S2`.
pub(crate) const SOURCE: &str = r#"
    using T = cuda::std::remove_const_t<cuda::std::remove_pointer_t<decltype(window)>>;
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int B = window_shape[0], C = window_shape[2];
    const int L = window_shape[1] - K + 1;
    if (i >= (size_t)B * L * C) return;
    const int c = i % C;
    const size_t bl = i / C;
    const int l = bl % L, b = bl / L;
    const T* x = window + (size_t)b * window_strides[0] + (size_t)l * window_strides[1] + (size_t)c * window_strides[2];
    const float* w = taps + (size_t)c * taps_strides[0];
    float acc = static_cast<float>(x[0]) * w[0];
    #pragma unroll
    for (int j = 1; j < K; ++j) acc += static_cast<float>(x[(size_t)j * window_strides[1]]) * w[(size_t)j * taps_strides[1]];
    const float y = static_cast<float>(static_cast<T>(acc));
    const T out = static_cast<T>(y / (1.0f + expf(-y)));
    if (c < S1) first[bl * S1 + c] = out;
    else if (c < S2) second[bl * (S2 - S1) + (c - S1)] = out;
    else third[bl * (C - S2) + (c - S2)] = out;
"#;

const THREADS: i32 = 256;

fn kernel() -> Result<&'static CudaKernel> {
    static KERNEL: Cached = Cached::new();
    cached(&KERNEL, || {
        CudaKernel::new("depthwise_conv_silu_heads", &["window", "taps"], &["first", "second", "third"], SOURCE)
    })
}

/// `silu(conv(window))` split by channel into three groups of `(heads,
/// dim)`, each `[B, L, heads, dim]` in the window's dtype. `taps` is `[C,
/// K]` float32. None for what it does not take (the groups not covering
/// the channels, other ranks or dtypes, a launch past 2^31 threads).
pub fn silu_heads(window: &Array, taps: &Array, groups: [(i32, i32); 3]) -> Result<Option<[Array; 3]>> {
    let (&[b, w, c], &[tc, k]) = (window.shape(), taps.shape()) else { return Ok(None) };
    let widths = groups.map(|(h, d)| h * d);
    let dt = window.dtype();
    let float = matches!(dt, Dtype::Bfloat16 | Dtype::Float16 | Dtype::Float32);
    if tc != c || taps.dtype() != Dtype::Float32 || !float || w < k || widths.iter().sum::<i32>() != c {
        return Ok(None);
    }
    let l = w - k + 1;
    let Ok(total) = i32::try_from(b as i64 * l as i64 * c as i64) else { return Ok(None) };
    let shapes = groups.map(|(h, d)| [b, l, h, d]);
    let out = kernel()?.apply(
        &[window, taps],
        &Launch {
            grid: [(total + THREADS - 1) / THREADS * THREADS, 1, 1],
            threads: [THREADS, 1, 1],
            outputs: &[(&shapes[0], dt), (&shapes[1], dt), (&shapes[2], dt)],
            template: &[
                Template::Int("K", k),
                Template::Int("S1", widths[0]),
                Template::Int("S2", widths[0] + widths[1]),
            ],
        },
    )?;
    let [first, second, third]: [Array; 3] = out.try_into().map_err(|_| crate::error("three outputs"))?;
    Ok(Some([first, second, third]))
}
