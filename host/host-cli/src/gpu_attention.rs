//! `--gpu-attention fast|mlx`: which kernels attend multi-token queries
//! (prompts, speculative verify rounds) on a GPU.
//!
//! `fast` (the default) lets model-kit take its own paths for short queries:
//! per-query fused kernels up to 16 queries, unfused matmuls up to 2048
//! (`short_attention`). MLX's sdpa sends multi-token queries to cuDNN, which
//! builds a graph per new shape: 40-70 ms per new prompt length or verify
//! width on the H200. Those paths round differently from MLX's sdpa, so in
//! bf16 greedy output can part from mlx-lm's after some tokens (logits stay
//! within bf16 tolerance; docs/benchmarks.md, session 5).
//!
//! `mlx` sends every query through MLX's sdpa, as mlx-lm does: on the H200
//! bf16 greedy output was then mlx-lm's token for token. model-kit reads its
//! two limits from the environment once, in every plugin's copy, so the
//! host sets them before any plugin runs a forward. On the CPU both modes
//! run the same kernels.

use anyhow::{bail, Result};

/// Applies the mode (None = the default, `fast`).
pub fn apply(mode: Option<&str>) -> Result<()> {
    match mode.unwrap_or("fast") {
        "fast" => Ok(()),
        "mlx" => {
            // Limits of 0 turn both short-query paths off.
            std::env::set_var("MLX_ENGINE_PER_QUERY_MAX", "0");
            std::env::set_var("MLX_ENGINE_UNFUSED_MAX", "0");
            Ok(())
        }
        other => bail!("--gpu-attention must be fast or mlx, not {other:?}"),
    }
}
