//! The assistant's network (mlx-vlm `Gemma4AssistantDraftModel`): one step
//! maps `[target_embed(token) · embed_scale, hidden]` through
//! `pre_projection` to the drafter's width, through Gemma 4 decoder layers
//! whose attention has queries only (keys and values are the target's, of
//! its last layer of the same kind), then `norm`; the normed state gives
//! the logits (`head.rs`) and, through `post_projection`, the hidden state
//! the next step reads in the target's width.
//!
//! A layer: input norm → q_proj, q_norm, RoPE at the query position →
//! attention over the target's K/V (scale 1) → o_proj → post-attention
//! norm, residual; pre-feed-forward norm → GeGLU MLP → post-feed-forward
//! norm, residual; times `layer_scalar`.

use crate::config::{Args, LayerArgs};
use crate::head::Head;
use model_kit::attention::{sdpa, Mask};
use model_kit::layers::{Linear, LoadCtx, RmsNorm};
use model_kit::mlp::Mlp;
use model_kit::rope::{Position, Rope};
use model_kit::{Array, Result};
use plugin_sdk::mlx_rs::ops;

/// The target's keys and values one layer kind attends, `[1, H_kv, L, D]`.
pub struct Kv {
    pub keys: Array,
    pub values: Array,
}

/// The K/V of each kind the layers attend (a kind no layer has: None).
pub struct Views {
    pub sliding: Option<Kv>,
    pub full: Option<Kv>,
}

struct Layer {
    sliding: bool,
    q: Linear,
    q_norm: RmsNorm,
    o: Linear,
    rope: Rope,
    heads: i32,
    mlp: Mlp,
    input_norm: RmsNorm,
    post_attn_norm: RmsNorm,
    pre_ff_norm: RmsNorm,
    post_ff_norm: RmsNorm,
    scalar: Array,
}

impl Layer {
    fn load(ctx: &mut LoadCtx, p: &str, a: &Args, l: &LayerArgs) -> Result<Self> {
        let h = a.hidden;
        let norm = |ctx: &mut LoadCtx, name: &str| RmsNorm::load(ctx, &format!("{p}.{name}"), h, a.eps);
        let width = a.heads * l.head_dim;
        let rope = Rope::new(l.head_dim as i32, l.rope_theta, a.rope_traditional, Some(&l.rope))?;
        if let Some(f) = rope.freqs() {
            ctx.loaded.push(f.clone());
        }
        let scalar = ctx.tensor(&format!("{p}.layer_scalar"), &[1])?;
        ctx.loaded.push(scalar.clone());
        Ok(Self {
            sliding: l.sliding,
            q: Linear::load(ctx, &format!("{p}.self_attn.q_proj"), width, h, false)?,
            q_norm: RmsNorm::load(ctx, &format!("{p}.self_attn.q_norm"), l.head_dim, a.eps)?,
            o: Linear::load(ctx, &format!("{p}.self_attn.o_proj"), h, width, false)?,
            rope,
            heads: a.heads as i32,
            mlp: Mlp::load_geglu(ctx, &format!("{p}.mlp"), h, a.intermediate)?,
            input_norm: norm(ctx, "input_layernorm")?,
            post_attn_norm: norm(ctx, "post_attention_layernorm")?,
            pre_ff_norm: norm(ctx, "pre_feedforward_layernorm")?,
            post_ff_norm: norm(ctx, "post_feedforward_layernorm")?,
            scalar,
        })
    }

    fn forward(&self, h: &Array, kv: &Kv, at: i32) -> Result<Array> {
        let x = self.input_norm.forward(h)?;
        let l = x.shape()[1];
        let q = self.q_norm.forward(&self.q.forward(&x)?.reshape(&[1, l, self.heads, -1])?)?;
        let q = self.rope.apply(&q.transpose_axes(&[0, 2, 1, 3])?, &Position::Offset(at))?;
        let out = sdpa(&q, &kv.keys, &kv.values, 1.0, &Mask::None)?;
        let a = self.o.forward(&out.transpose_axes(&[0, 2, 1, 3])?.reshape(&[1, l, -1])?)?;
        let h = h.add(&self.post_attn_norm.forward(&a)?)?;
        let m = self.post_ff_norm.forward(&self.mlp.forward(&self.pre_ff_norm.forward(&h)?)?)?;
        h.add(&m)?.multiply(&self.scalar)
    }
}

pub struct Net {
    pre_projection: Linear,
    post_projection: Linear,
    layers: Vec<Layer>,
    norm: RmsNorm,
    pub head: Head,
}

/// One step's outputs: logits `[1, 1, V]` and the next hidden `[1, 1, BH]`.
pub struct Step {
    pub logits: Array,
    pub hidden: Array,
}

impl Net {
    pub fn load(ctx: &mut LoadCtx, a: &Args) -> Result<Self> {
        let layers = a
            .layers
            .iter()
            .enumerate()
            .map(|(i, l)| Layer::load(ctx, &format!("model.layers.{i}"), a, l))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            pre_projection: Linear::load(ctx, "pre_projection", a.hidden, 2 * a.backbone_hidden, false)?,
            post_projection: Linear::load(ctx, "post_projection", a.backbone_hidden, a.hidden, false)?,
            layers,
            norm: RmsNorm::load(ctx, "model.norm", a.hidden, a.eps)?,
            head: Head::load(ctx, a)?,
        })
    }

    /// Which layer kinds the layers attend: (any sliding, any full).
    pub fn kinds(&self) -> (bool, bool) {
        (self.layers.iter().any(|l| l.sliding), self.layers.iter().any(|l| !l.sliding))
    }

    /// One draft step from the scaled token embedding and the previous
    /// hidden state (both `[1, 1, BH]`), the query at position `at`.
    pub fn step(&self, embed: &Array, hidden: &Array, views: &Views, at: i32) -> Result<Step> {
        let mut h = self.pre_projection.forward(&ops::concatenate(&[embed, hidden], -1)?)?;
        for layer in &self.layers {
            let kv = if layer.sliding { &views.sliding } else { &views.full };
            let kv = kv.as_ref().ok_or_else(|| model_kit::error("assistant: no target K/V for a layer's kind"))?;
            h = layer.forward(&h, kv, at)?;
        }
        let h = self.norm.forward(&h)?;
        Ok(Step { logits: self.head.logits(&h)?, hidden: self.post_projection.forward(&h)? })
    }
}
