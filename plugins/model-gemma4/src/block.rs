//! One Gemma 4 decoder layer: attention and a gelu_approx-gated MLP (plus
//! the expert branch with `enable_moe_block`), each between plain RMSNorms
//! with a residual add; then the per-layer input gate
//! (when the model has per-layer inputs) and the layer scalar, which
//! multiplies the whole residual stream.

use crate::args::Args;
use crate::attention::{Attention, KvSource, SharedKv};
use crate::moe::MoeBranch;
use model_kit::attention::Mask;
use model_kit::compiled::gelu_approx;
use model_kit::layers::{Linear, LoadCtx, RmsNorm};
use model_kit::mlp::Mlp;
use model_kit::{Array, Result};

/// `h + norm(proj(gelu_approx(gate(h)) * per_layer_input))`.
struct PerLayerGate {
    gate: Linear,
    proj: Linear,
    norm: RmsNorm,
}

impl PerLayerGate {
    fn forward(&self, h: &Array, input: &Array) -> Result<Array> {
        // mlx-lm fuses gelu_approx alone here (its MLP fuses the product too).
        let g = gelu_approx(&self.gate.forward(h)?)?.multiply(input)?;
        h.add(self.norm.forward(&self.proj.forward(&g)?)?)
    }
}

pub struct Block {
    attn: Attention,
    mlp: Mlp,
    moe: Option<MoeBranch>,
    input_norm: RmsNorm,
    post_attn_norm: RmsNorm,
    pre_ff_norm: RmsNorm,
    post_ff_norm: RmsNorm,
    per_layer: Option<PerLayerGate>,
    layer_scalar: Array,
    pub sliding: bool,
}

impl Block {
    pub fn load(ctx: &mut LoadCtx, p: &str, a: &Args, layer: usize) -> Result<Self> {
        let (hidden, eps, plh) = (a.hidden, a.rms_norm_eps, a.per_layer_hidden);
        let norm = |ctx: &mut LoadCtx, name: &str| RmsNorm::load(ctx, &format!("{p}.{name}"), hidden, eps);
        let per_layer = if plh > 0 {
            Some(PerLayerGate {
                gate: Linear::load(ctx, &format!("{p}.per_layer_input_gate"), plh, hidden, false)?,
                proj: Linear::load(ctx, &format!("{p}.per_layer_projection"), hidden, plh, false)?,
                norm: norm(ctx, "post_per_layer_input_norm")?,
            })
        } else {
            None
        };
        let layer_scalar = ctx.tensor(&format!("{p}.layer_scalar"), &[1])?;
        ctx.loaded.push(layer_scalar.clone());
        Ok(Self {
            attn: Attention::load(ctx, &format!("{p}.self_attn"), a, layer)?,
            // The KV-shared layers' MLPs are twice as wide with `use_double_wide_mlp`.
            mlp: Mlp::load_geglu(ctx, &format!("{p}.mlp"), hidden, a.mlp_width(layer))?,
            moe: a.moe.as_ref().map(|m| MoeBranch::load(ctx, p, a.hidden, m, eps)).transpose()?,
            input_norm: norm(ctx, "input_layernorm")?,
            post_attn_norm: norm(ctx, "post_attention_layernorm")?,
            pre_ff_norm: norm(ctx, "pre_feedforward_layernorm")?,
            post_ff_norm: norm(ctx, "post_feedforward_layernorm")?,
            per_layer,
            layer_scalar,
            sliding: a.sliding[layer],
        })
    }

    /// `per_layer_input` is this layer's slice `[B, L, per_layer_hidden]`.
    pub fn forward(
        &self,
        x: &Array,
        mask: &Mask,
        kv: KvSource<'_>,
        per_layer_input: Option<&Array>,
    ) -> Result<(Array, Option<SharedKv>)> {
        let (r, shared) = self.attn.forward(&self.input_norm.forward(x)?, mask, kv)?;
        let h = x.add(self.post_attn_norm.forward(&r)?)?;
        let dense = self.mlp.forward(&self.pre_ff_norm.forward(&h)?)?;
        let r = match &self.moe {
            Some(moe) => moe.forward(&h, &dense)?,
            None => dense,
        };
        let mut h = h.add(self.post_ff_norm.forward(&r)?)?;
        if let (Some(gate), Some(input)) = (&self.per_layer, per_layer_input) {
            h = gate.forward(&h, input)?;
        }
        Ok((h.multiply(&self.layer_scalar)?, shared))
    }
}
