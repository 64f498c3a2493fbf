//! The view's gather on the GPU: every row's blocks copied out of the pool
//! by a CUDA kernel of our own (model-kit's `cuda_kernel`), one CUDA block
//! per block of one head, in place of MLX's `take` over `[H * capacity,
//! block, D]` (docs/benchmarks.md, "Paged K/V on the H200"). It is the same
//! copy, so attention reads the same K/V bit for bit.

use model_kit::cuda_kernel::{cached, Cached, CudaKernel, Launch, Template};
use model_kit::{error, Array, Result};

/// `out[b, h, j * BLOCK + i, d] = pool[h, (flat[b, h, j] % cap) * BLOCK + i, d]`
/// where `flat` holds `h * cap + block` (`Storage::flat_table`). A block of
/// one head is `BLOCK * D` contiguous elements on both sides, so each CUDA
/// block copies one as a run of 16-byte words.
const SOURCE: &str = r#"
    const int H = flat_shape[1];
    const int NB = flat_shape[2];
    const int D = pool_shape[2];
    const int cap = pool_shape[1] / BLOCK;
    const size_t blk = blockIdx.x;
    const int j = blk % NB;
    const size_t bh = blk / NB;
    const int h = bh % H;
    const int b = bh / H;
    const int f = flat[(size_t)b * flat_strides[0] + (size_t)h * flat_strides[1] + (size_t)j * flat_strides[2]];
    const size_t src = (size_t)(f / cap) * pool_strides[0] + (size_t)(f % cap) * BLOCK * pool_strides[1];
    const size_t dst = (bh * NB + j) * (size_t)BLOCK * D;
    const int n = BLOCK * D;
    constexpr int PER = 16 / sizeof(out[0]);
    if (pool_strides[2] == 1 && pool_strides[1] == D && n % PER == 0) {
        const uint4* from = reinterpret_cast<const uint4*>(pool + src);
        uint4* to = reinterpret_cast<uint4*>(out + dst);
        for (int i = threadIdx.x; i < n / PER; i += blockDim.x) to[i] = from[i];
    } else {
        for (int i = threadIdx.x; i < n; i += blockDim.x)
            out[dst + i] = pool[src + (size_t)(i / D) * pool_strides[1] + (size_t)(i % D) * pool_strides[2]];
    }
"#;

const THREADS: i32 = 128;

fn kernel() -> Result<&'static CudaKernel> {
    static KERNEL: Cached = Cached::new();
    cached(&KERNEL, || CudaKernel::new("kv_paged_gather_blocks", &["pool", "flat"], &["out"], SOURCE))
}

/// `[B, H, nb * block, D]`: the blocks `flat` (`[B * H * nb]`) names out of
/// `pool` (`[H, capacity * block, D]`); None for a view past one launch's
/// 2^31 threads (the caller takes MLX's gather).
pub fn gather(pool: &Array, flat: &Array, rows: i32, nb: i32, block: i32) -> Result<Option<Array>> {
    let (h, d) = (pool.shape()[0], pool.shape()[2]);
    // One CUDA block per (row, head, block of the table).
    let Ok(grid) = i32::try_from(rows as i64 * h as i64 * nb as i64 * THREADS as i64) else {
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

#[cfg(test)]
mod tests {
    use super::*;
    use model_kit::cuda_capture::launches;
    use model_kit::kernel_check::{assert_compiles, kernels};
    use model_kit::Dtype;
    use plugin_sdk::mlx_rs;

    /// The kernel compiles for the H200 (`model_kit::kernel_check`) at the
    /// gathers the layout makes: bf16 and float32 pools of 16-key blocks.
    #[test]
    fn the_gather_kernel_compiles_for_the_h200() {
        let recorded = launches(|| -> Result<()> {
            for dtype in [Dtype::Bfloat16, Dtype::Float32] {
                let pool = mlx_rs::ops::zeros_dtype(&[8, 64 * 16, 128], dtype)?;
                let flat = mlx_rs::ops::zeros_dtype(&[4 * 8 * 10], Dtype::Int32)?;
                assert!(gather(&pool, &flat, 4, 10, 16)?.is_some(), "the kernel takes it");
            }
            Ok(())
        })
        .unwrap();
        assert_eq!(kernels(&recorded), ["kv_paged_gather_blocks"]);
        assert_compiles(&recorded);
    }
}
