//! Stored affine code rows dequantized in place on the GPU, for the
//! attention of many queries (prompt chunks, speculative verifies) over a
//! layer's codes: one CUDA kernel of ours reads each token's packed words,
//! scale and bias where the layout keeps them (`[B, H, T, width]`, strided
//! along the token axis) and writes the values once.
//!
//! Taking the rows apart for MLX's own `dequantize` (a slice of the last
//! axis and a widening bit-cast per part, then the row-contiguous copies its
//! CUDA kernel wants) copies the whole window four times per layer call, each
//! into a new buffer as long as the window; at 16 rows of 8k tokens those
//! buffers filled MLX's cache and the quantized prefill ran at half of bf16's
//! pace (docs/benchmarks.md, "Prefill over quantized K/V"). Here the only
//! buffer is the output the attention reads.
//!
//! Each thread turns one packed 32-bit word into `32 / BITS` values with
//! MLX's own arithmetic (`T(code) * scale + bias` in the values' type), so
//! the result is bit for bit `mx.dequantize` of the same codes.

use crate::codec::Affine;
use model_kit::cuda_kernel::{cached, Cached, CudaKernel, Launch, Template};
use model_kit::{error, Array, Dtype, Result};

const SOURCE: &str = r#"
    constexpr int WORDS = D * BITS / 32;
    constexpr int CPW = 32 / BITS;
    constexpr int NWS = WORDS * PER_WORD;
    constexpr int NG = D / GROUP;
    constexpr unsigned LOW = (1u << BITS) - 1;
    auto value_of = [](auto bits) {
        if constexpr (VALUES == 0) return __ushort_as_bfloat16(bits);
        else if constexpr (VALUES == 1) return __ushort_as_half(bits);
        else return __uint_as_float(bits);
    };
    const int H = codes_shape[1];
    const int T = codes_shape[2];
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t total = (size_t)codes_shape[0] * H * T * WORDS;
    if (i >= total) return;
    const int w = i % WORDS;
    size_t r = i / WORDS;
    const int t = r % T;
    r /= T;
    const int h = r % H;
    const int b = r / H;
    const auto* row = codes + (size_t)b * codes_strides[0] + (size_t)h * codes_strides[1] + (size_t)t * codes_strides[2];
    const uint32_t word = reinterpret_cast<const uint32_t*>(row)[w];
    const int g = w * CPW / GROUP;
    const auto scale = value_of(row[NWS + g]);
    const auto bias = value_of(row[NWS + NG + g]);
    using V = decltype(scale);
    auto* o = out + (((size_t)b * H + h) * T + t) * D + (size_t)w * CPW;
    for (int j = 0; j < CPW; ++j) o[j] = static_cast<V>(static_cast<float>((word >> (j * BITS)) & LOW)) * scale + bias;
"#;

const THREADS: i32 = 256;

fn kernel() -> Result<&'static CudaKernel> {
    static KERNEL: Cached = Cached::new();
    cached(&KERNEL, || CudaKernel::new("kv_codes_dequantize_rows", &["codes"], &["out"], SOURCE))
}

/// The values of stored code rows `codes` (`[B, H, T, width]`, the last
/// axis contiguous, read in place) of `dim`-wide heads in `dtype`, as
/// `[B, H, T, dim]`; None where this kernel does not apply (not on the GPU,
/// a width that does not split into whole words): the caller then takes
/// the rows apart for MLX's `dequantize`.
pub fn dequantize_rows(codes: &Array, dim: i32, dtype: Dtype, codec: Affine) -> Result<Option<Array>> {
    let &[b, h, t, width] = codes.shape() else { return Ok(None) };
    let values_as = match dtype {
        Dtype::Bfloat16 => 0,
        Dtype::Float16 => 1,
        Dtype::Float32 => 2,
        _ => return Ok(None),
    };
    let words = dim * codec.bits / 32;
    let total = b as i64 * h as i64 * t as i64 * words as i64;
    let fits = model_kit::ops::on_gpu()
        && codes.dtype() == Affine::storage(dtype)?
        && dim * codec.bits % 32 == 0
        && codec.group % (32 / codec.bits) == 0
        && codec.width(dim, dtype)? == width
        && total > 0
        && total + THREADS as i64 <= i32::MAX as i64;
    if !fits {
        return Ok(None);
    }
    let blocks = (total as i32 + THREADS - 1) / THREADS;
    let outs = kernel()?.apply(
        &[codes],
        &Launch {
            grid: [blocks * THREADS, 1, 1],
            threads: [THREADS, 1, 1],
            outputs: &[(&[b, h, t, dim], dtype)],
            template: &[
                Template::Int("BITS", codec.bits),
                Template::Int("GROUP", codec.group),
                Template::Int("D", dim),
                Template::Int("PER_WORD", if values_as == 2 { 1 } else { 2 }),
                Template::Int("VALUES", values_as),
            ],
        },
    )?;
    outs.into_iter().next().map(Some).ok_or_else(|| error("the dequantize kernel returned no output"))
}
