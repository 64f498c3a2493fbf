//! KV cache scheme flags shared by `serve` (and its TOML file), `generate`,
//! `fit`, `bench` and `logits`, turned into the engine's scheme string.

use anyhow::{bail, Result};
use clap::Args;

#[derive(Args, Debug, Default, Clone, serde::Deserialize, serde::Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct KvArgs {
    /// K/V storage: off (the compute dtype), 8 or 4 (affine codes as mlx-lm's kv_bits, attended through quantized matmuls), turbo[:kXvY] (TurboQuant on full-attention layers: X-bit affine keys, Y-bit rotated Lloyd-Max values; default k8v3).
    #[arg(long = "kv-quant", value_name = "off|8|4|turbo[:kXvY]")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_quant: Option<String>,
    /// Values per scale and bias of quantized K/V (mlx-lm's kv_group_size): 32, 64 or 128 (default 64).
    #[arg(long = "kv-group-size")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_group_size: Option<u32>,
    /// Tokens a cache holds in the compute dtype before its K/V turn into codes (mlx-lm's quantized_kv_start; default 0).
    #[arg(long = "quantized-kv-start")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quantized_kv_start: Option<u64>,
    /// K/V of full-attention layers in a pool of fixed-size blocks with a block table per row: rows that share a prefix (prefix-cache hits, batched rows merged from one state) hold its blocks once, by reference. Plain K/V only (not with --kv-quant).
    #[arg(long = "paged-kv")]
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub paged_kv: bool,
    /// Tokens per block of --paged-kv (default 16).
    #[arg(long = "kv-block-size")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_block_size: Option<u32>,
}

impl KvArgs {
    /// `CacheSpec.scheme` for these flags, or the one line that refuses them.
    pub fn scheme(&self) -> Result<String> {
        let quant = self.kv_quant.as_deref().unwrap_or("off");
        if self.paged_kv {
            if quant != "off" {
                bail!("--paged-kv with --kv-quant {quant} is not built: paged blocks hold plain K/V (use one or the other)");
            }
            if self.kv_group_size.is_some() || self.quantized_kv_start.is_some() {
                bail!("--kv-group-size and --quantized-kv-start need --kv-quant 8, 4 or turbo, not --paged-kv");
            }
            return Ok(host_engine::paged_scheme(self.kv_block_size.unwrap_or(16))?);
        }
        if self.kv_block_size.is_some() {
            bail!("--kv-block-size needs --paged-kv");
        }
        if quant == "off" && (self.kv_group_size.is_some() || self.quantized_kv_start.is_some()) {
            bail!("--kv-group-size and --quantized-kv-start need --kv-quant 8, 4 or turbo");
        }
        Ok(host_engine::kv_scheme(quant, self.kv_group_size.unwrap_or(64), self.quantized_kv_start.unwrap_or(0))?)
    }
}
