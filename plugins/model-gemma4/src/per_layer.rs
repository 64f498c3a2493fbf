//! Per-layer input embeddings (`hidden_size_per_layer_input`): a second
//! token table with `layers * per_layer_hidden` columns, mixed with a
//! projection of the scaled token embedding, giving each decoder layer its
//! own `[B, L, per_layer_hidden]` input for the gate after its MLP.

use crate::args::Args;
use mlx_rs::ops;
use model_kit::layers::{Embedding, Linear, LoadCtx, RmsNorm};
use model_kit::ops::scalar;
use model_kit::{ops as kit_ops, Array, Result};

pub struct PerLayerInputs {
    embed: Embedding,
    projection: Linear,
    norm: RmsNorm,
    layers: i32,
    width: i32,
    /// sqrt(per_layer_hidden), hidden^-0.5, 2^-0.5 (Python floats in mlx-lm).
    embed_scale: f64,
    projection_scale: f64,
    input_scale: f64,
}

impl PerLayerInputs {
    pub fn load(ctx: &mut LoadCtx, root: &str, a: &Args) -> Result<Self> {
        let all = a.layers * a.per_layer_hidden;
        Ok(Self {
            embed: Embedding::load(ctx, &format!("{root}embed_tokens_per_layer"), a.vocab_size_per_layer, all)?,
            projection: Linear::load(ctx, &format!("{root}per_layer_model_projection"), all, a.hidden, false)?,
            norm: RmsNorm::load(ctx, &format!("{root}per_layer_projection_norm"), a.per_layer_hidden, a.rms_norm_eps)?,
            layers: a.layers as i32,
            width: a.per_layer_hidden as i32,
            embed_scale: (a.per_layer_hidden as f64).sqrt(),
            projection_scale: (a.hidden as f64).powf(-0.5),
            input_scale: 2f64.powf(-0.5),
        })
    }

    /// `[B, L, layers, width]` for token ids `[B, L]` and the SCALED token
    /// embeddings `h` (mlx-lm's `_get_per_layer_inputs` then
    /// `_project_per_layer_inputs`).
    pub fn compute(&self, tokens: &Array, h: &Array) -> Result<Array> {
        let split = [self.layers, self.width];
        let e = self.embed.forward(tokens)?;
        let e = ops::unflatten(&e.multiply(scalar(self.embed_scale, e.dtype())?)?, -1, &split)?;
        let p = self.projection.forward(h)?;
        let p = ops::unflatten(&p.multiply(scalar(self.projection_scale, p.dtype())?)?, -1, &split)?;
        let p = self.norm.forward(&p)?;
        let sum = p.add(&e)?;
        sum.multiply(scalar(self.input_scale, sum.dtype())?)
    }

    /// Layer `i`'s input, `all[:, :, i, :]`.
    pub fn layer(all: &Array, i: usize) -> Result<Array> {
        let s = all.shape();
        let i = i as i32;
        kit_ops::slice(all, &[0, 0, i, 0], &[s[0], s[1], i + 1, s[3]])?.squeeze_axes(&[2])
    }
}
