//! Options for the model family plugin (`--model-option key=value`, passed
//! at open through the ABI's `ModelOpenArgs.options`), and `--gpu-attention`,
//! the one every user may want, as a named flag.
//!
//! `--gpu-attention fast` (the default) lets model-kit take its own paths
//! for multi-token queries on a GPU (per-query fused kernels up to 16
//! queries, unfused matmuls up to 2048; MLX's sdpa sends them to cuDNN,
//! which builds a graph per new shape: 40-70 ms per new prompt length or
//! verify width on the H200). Those paths round differently from MLX's
//! sdpa, so in bf16 greedy output can part from mlx-lm's after some tokens.
//! `mlx` sends every query through MLX's sdpa, as mlx-lm does. On the CPU
//! both run the same kernels. model-kit documents every option it reads.

use crate::draft_cmd::key_values;
use anyhow::{bail, Result};

pub fn options(gpu_attention: Option<&str>, given: &[String]) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    match gpu_attention {
        None | Some("fast") => {}
        Some("mlx") => out.push(("attention".to_owned(), "mlx".to_owned())),
        Some(other) => bail!("--gpu-attention must be fast or mlx, not {other:?}"),
    }
    out.extend(key_values("--model-option", given)?);
    Ok(out)
}
