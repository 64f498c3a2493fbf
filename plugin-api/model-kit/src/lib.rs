//! Shared layers that every model-family plugin reuses, so that a family is
//! one small file in the shape of mlx-lm's `models/<family>.py`.
//!
//! Owns: reading config values and model folders (safetensors, sharded or
//! not, MLX affine-quantized checkpoints), every tensor's shape checked
//! against the one config.json implies before a graph is built (`shape`),
//! the layers (linear, embedding, RMSNorm, RoPE variants, SwiGLU MLP),
//! attention through a cache-layout plugin, hidden taps, and the few raw
//! MLX ops mlx-rs does not expose. Numerics follow
//! mlx-lm op for op (same kernels, same order), because greedy parity with
//! mlx-lm is a tested promise.

pub mod attention;
pub mod bucketed_attention;
pub mod checkpoint;
pub mod compiled;
pub mod config;
#[cfg(test)]
mod conv_kernels_on_host;
pub mod conv_window;
pub mod cuda_capture;
pub mod cuda_kernel;
pub mod cuda_source;
pub mod decode_attention;
#[cfg(test)]
mod decode_attention_on_host;
pub mod depthwise_conv;
pub mod depthwise_conv_kernel;
pub mod fused_layers;
pub mod gated_attention;
pub mod gemv;
#[cfg(test)]
mod gemv_on_host;
pub mod graph;
pub mod kernel_check;
#[cfg(test)]
mod kernels_compile;
pub mod kv_write;
#[cfg(test)]
mod kv_write_on_host;
pub mod layers;
pub mod lm_head;
pub mod mask;
pub mod mlp;
pub mod moe;
#[cfg(test)]
mod on_host;
pub mod ops;
pub mod qk_norm_rope;
#[cfg(test)]
mod qk_norm_rope_on_host;
pub mod rope;
pub mod routes;
pub mod shape;
pub mod shard;
pub mod short_attention;
pub mod taps;
#[cfg(test)]
mod test_arrays;
pub mod weights;

pub use mlx_rs::error::Exception;
pub use mlx_rs::{Array, Dtype};

/// The error type of the layers: MLX's own, or ours in the same shape.
pub type Result<T> = std::result::Result<T, Exception>;

/// An error with a message, in MLX's error type.
pub fn error(msg: impl Into<String>) -> Exception {
    Exception::custom(msg.into())
}
