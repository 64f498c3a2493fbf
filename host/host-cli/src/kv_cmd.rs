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
    /// A paged block pool for K/V: not built in this host (refused at start).
    #[arg(long = "paged-kv")]
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub paged_kv: bool,
}

impl KvArgs {
    /// `CacheSpec.scheme` for these flags, or the one line that refuses them.
    pub fn scheme(&self) -> Result<String> {
        if self.paged_kv {
            bail!("--paged-kv is not built in this host (K/V schemes built: --kv-quant off, 8, 4, turbo)");
        }
        let quant = self.kv_quant.as_deref().unwrap_or("off");
        if quant == "off" && (self.kv_group_size.is_some() || self.quantized_kv_start.is_some()) {
            bail!("--kv-group-size and --quantized-kv-start need --kv-quant 8, 4 or turbo");
        }
        Ok(host_engine::kv_scheme(quant, self.kv_group_size.unwrap_or(64), self.quantized_kv_start.unwrap_or(0))?)
    }
}
