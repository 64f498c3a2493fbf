//! Quantized K/V for cache layouts, as mlx-lm's `QuantizedKVCache` keeps
//! them (mlx-lm 0.32.2, `models/cache.py`, `models/base.py`).
//!
//! A layout stores each token's keys and values as columns along the token
//! axis; every operation it does (growth, slice updates, trim, rings,
//! padding, row gathers, exports) moves whole columns. Affine quantization
//! groups along the head dimension, so a token's codes depend on that token
//! alone: quantizing then moving columns equals moving then quantizing. So
//! a quantized scheme is the same layout holding each token's CODES in place
//! of its values:
//! - `codec`: one token's K (or V) row `[D]` as one row of unsigned words:
//!   the packed values, scales and biases of `mx.quantize`, bit-cast side by
//!   side (copies of unsigned words are bitwise on every backend);
//! - `attention`: mlx-lm's `quantized_scaled_dot_product_attention`
//!   (quantized matmuls for the scores and for the weighted values) on the
//!   CPU; on the GPU, whose MLX backend has no quantized matmul for codes
//!   read in place, the codes dequantized for the fused attention
//!   (`Route`): decode steps over affine codes read them in place in a CUDA
//!   kernel of ours (`codes_attention`), longer queries over affine codes
//!   get them dequantized in place by another (`dequantize_rows`);
//! - `layout`: [`Quantized`], the `CacheLayout` around any layout that
//!   implements [`Columns`]: plain K/V until the cache holds
//!   `quantized_kv_start` tokens (mlx-lm's `maybe_quantize_kv_cache`), codes
//!   from then on, attention by the layout itself (`CacheLayout::attend`);
//! - `turbo`, `rotation`, `lloyd_max`: TurboQuant's codes (affine keys;
//!   values rotated by a randomized Hadamard transform and quantized by the
//!   Lloyd-Max levels of N(0, 1), with their norm);
//! - `scheme`: reading `CacheSpec.scheme` (`affine8:group=64,start=0`,
//!   `turbo:k=8,v=3,group=64,start=0`) into a codec (`KvCodec`).

mod attention;
mod codec;
mod codes_attention;
mod dequantize_rows;
mod layout;
pub mod lloyd_max;
pub mod rotation;
mod scheme;
mod turbo;

pub use attention::{dequantized_sdpa, quantized_sdpa, QMask, Route};
pub use codec::{Affine, Codes, Widths};
pub use layout::{Columns, Quantized};
pub use scheme::{KvCodec, Scheme};
pub use turbo::Turbo;

#[cfg(test)]
mod kernels_compile;
#[cfg(test)]
mod tests;
