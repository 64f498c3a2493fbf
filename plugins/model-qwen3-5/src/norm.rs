//! The model's RMSNorm, loaded with mlx-lm's sanitize rule for raw Hugging
//! Face checkpoints (their norm weights are stored minus one).

use model_kit::layers::LoadCtx;
use model_kit::ops::scalar;
use model_kit::{Array, Result};
use plugin_sdk::mlx_rs;

/// `nn.RMSNorm` (the fused kernel).
pub struct Norm {
    weight: Array,
    eps: f32,
}

impl Norm {
    /// `{path}.weight` `[dim]`. `shift`: add 1 to the stored weight, in its
    /// stored dtype and before any cast, as mlx-lm's sanitize does for
    /// unsanitized checkpoints.
    pub fn load(ctx: &mut LoadCtx, path: &str, dim: usize, eps: f32, shift: bool) -> Result<Self> {
        let w = ctx.take(&format!("{path}.weight"), &[dim])?;
        let w = if shift { w.add(scalar(1.0, w.dtype())?)? } else { w };
        let weight = ctx.cast(w)?;
        ctx.loaded.push(weight.clone());
        Ok(Self { weight, eps })
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        mlx_rs::fast::rms_norm(x, Some(&self.weight), self.eps)
    }
}
