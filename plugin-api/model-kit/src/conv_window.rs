//! A short conv's window step on the GPU, for the recurrent cache layout:
//! the stored last `keep` inputs and the new ones written side by side
//! (the window the conv reads) and the window's last `keep` columns written
//! as the next stored state, in one launch. MLX's ops take three (a
//! concatenate's two copies, then the contiguous copy of the window's
//! tail) and four graph nodes, in every linear-attention layer of every
//! decode step, where the host's time per node bounds a step
//! (docs/benchmarks.md, "The hybrid's layers in fewer kernels").

use crate::cuda_kernel::{cached, Cached, CudaKernel, Launch, Template};
use crate::{Array, Result};

/// One thread per element of `window` (`[B, KEEP + L, C]`): column `t`
/// comes from `stored` (`[B, KEEP, C]`, strided) before `KEEP`, else from
/// `inputs` (`[B, L, C]`, strided); the last `KEEP` columns also go to
/// `state` (`[B, KEEP, C]`). Copied as they are: the window holds the same
/// bits as the concatenate.
pub(crate) const SOURCE: &str = r#"
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int B = inputs_shape[0], L = inputs_shape[1], C = inputs_shape[2];
    const int W = KEEP + L;
    if (i >= (size_t)B * W * C) return;
    const int c = i % C;
    const size_t bt = i / C;
    const int t = bt % W, b = bt / W;
    const auto v = t < KEEP
        ? stored[(size_t)b * stored_strides[0] + (size_t)t * stored_strides[1] + (size_t)c * stored_strides[2]]
        : inputs[(size_t)b * inputs_strides[0] + (size_t)(t - KEEP) * inputs_strides[1] + (size_t)c * inputs_strides[2]];
    window[i] = v;
    if (t >= L) state[((size_t)b * KEEP + (t - L)) * C + c] = v;
"#;

const THREADS: i32 = 256;

fn kernel() -> Result<&'static CudaKernel> {
    static KERNEL: Cached = Cached::new();
    cached(&KERNEL, || CudaKernel::new("conv_window", &["stored", "inputs"], &["window", "state"], SOURCE))
}

/// `(window, state)`: `[stored, inputs]` along axis 1 (`[B, keep + L, C]`)
/// and its last `keep` columns (`[B, keep, C]`, a buffer of its own).
/// None for arrays it does not take (other ranks, shapes or dtypes, a
/// launch past 2^31 threads): the caller takes MLX's ops.
pub fn step(stored: &Array, inputs: &Array) -> Result<Option<(Array, Array)>> {
    let (&[b, keep, c], &[bi, l, ci]) = (stored.shape(), inputs.shape()) else { return Ok(None) };
    if (b, c) != (bi, ci) || stored.dtype() != inputs.dtype() || keep < 1 || l < 1 {
        return Ok(None);
    }
    let Ok(total) = i32::try_from(b as i64 * (keep + l) as i64 * c as i64) else { return Ok(None) };
    let grid = (total + THREADS - 1) / THREADS * THREADS;
    let dt = inputs.dtype();
    let mut out = kernel()?.apply(
        &[stored, inputs],
        &Launch {
            grid: [grid, 1, 1],
            threads: [THREADS, 1, 1],
            outputs: &[(&[b, keep + l, c], dt), (&[b, keep, c], dt)],
            template: &[Template::Int("KEEP", keep)],
        },
    )?;
    let state = out.pop().expect("two outputs");
    let window = out.pop().expect("two outputs");
    Ok(Some((window, state)))
}
