//! The view's gather on the GPU: every row's blocks copied out of the pool
//! by a CUDA kernel of our own (model-kit's `cuda_kernel`), one thread per
//! element, in place of MLX's `take` over `[H * capacity, block, D]`:
//! batched steps 4-7% faster on an H200 (docs/benchmarks.md, "Paged K/V on
//! the H200"). It is the same copy, so attention reads the same K/V bit for
//! bit.

use model_kit::cuda_kernel::{cached, Cached, CudaKernel, Launch, Template};
use model_kit::{error, Array, Result};

/// `out[b, h, j * BLOCK + i, d] = pool[h, (flat[b, h, j] % cap) * BLOCK + i, d]`
/// where `flat` holds `h * cap + block` (`Storage::flat_table`).
const SOURCE: &str = r#"
    const int B = flat_shape[0];
    const int H = flat_shape[1];
    const int NB = flat_shape[2];
    const int D = pool_shape[2];
    const int T = NB * BLOCK;
    const size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (size_t)B * H * T * D) return;
    const int d = e % D;
    const size_t bt = e / D;
    const int t = bt % T;
    const size_t bh = bt / T;
    const int h = bh % H;
    const int b = bh / H;
    const int j = t / BLOCK;
    const int cap = pool_shape[1] / BLOCK;
    const int f = flat[(size_t)b * flat_strides[0] + (size_t)h * flat_strides[1] + (size_t)j * flat_strides[2]];
    const size_t s = (size_t)(f % cap) * BLOCK + t % BLOCK;
    out[e] = pool[(size_t)(f / cap) * pool_strides[0] + s * pool_strides[1] + (size_t)d * pool_strides[2]];
"#;

const THREADS: i32 = 256;

fn kernel() -> Result<&'static CudaKernel> {
    static KERNEL: Cached = Cached::new();
    cached(&KERNEL, || CudaKernel::new("kv_paged_gather_blocks", &["pool", "flat"], &["out"], SOURCE))
}

/// `[B, H, nb * block, D]`: the blocks `flat` (`[B * H * nb]`) names out of
/// `pool` (`[H, capacity * block, D]`); None for a view past one launch's
/// 2^31 threads (the caller takes MLX's gather).
pub fn gather(pool: &Array, flat: &Array, rows: i32, nb: i32, block: i32) -> Result<Option<Array>> {
    let (h, d) = (pool.shape()[0], pool.shape()[2]);
    let n = rows as i64 * h as i64 * (nb * block) as i64 * d as i64;
    let Ok(grid) = i32::try_from((n + THREADS as i64 - 1) / THREADS as i64 * THREADS as i64) else {
        return Ok(None);
    };
    let flat = flat.reshape(&[rows, h, nb])?;
    let out = kernel()?.apply(
        &[pool, &flat],
        &Launch {
            grid: [grid, 1, 1],
            threads: [THREADS, 1, 1],
            outputs: &[(&[rows, h, nb * block, d], pool.dtype())],
            template: &[Template::Int("BLOCK", block)],
        },
    )?;
    out.into_iter().next().map(Some).ok_or_else(|| error("the gather kernel returned nothing"))
}
