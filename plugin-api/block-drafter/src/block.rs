//! The block drafter's network (mlx-vlm `DFlashDraftModel._hidden`): the
//! target's hidden taps of new context positions become the context
//! `hidden_norm(fc(concat(taps)))`; each layer attends the block's queries
//! over the context's K/V (kept in the drafter's own cache, one row per
//! verified position) followed by the block's own K/V (never kept); then
//! `norm`. The context is projected by each layer's k/v projections
//! directly (no input norm), the block through the layer as usual.
//!
//! Gemma 4 layers (DeepSpec) put each sub-block between two norms, gate
//! the MLP with gelu, scale the layer's output by its `layer_scalar`, and
//! on `attention_k_eq_v` layers take the values from the key projection
//! before its norm.
//!
//! Positions are explicit: the context rows sit at the positions they were
//! verified at, the block from the anchor's position on. Without gaps this
//! is the reference's `cache.offset` and `cache.offset + S`; after a gap
//! (positions the host ran without states) the RoPE distances stay true.

use crate::config::{Args, Backbone};
use model_kit::attention::{sdpa, update, Mask};
use model_kit::layers::{Linear, LoadCtx, RmsNorm};
use model_kit::mlp::Mlp;
use model_kit::rope::{Position, Rope};
use model_kit::{Array, Result};
use plugin_api::CacheBox;
use plugin_sdk::mlx_rs::ops;

struct Attention {
    q: Linear,
    k: Linear,
    /// None: the values are the keys' projection (`attention_k_eq_v`).
    v: Option<Linear>,
    o: Linear,
    q_norm: RmsNorm,
    k_norm: RmsNorm,
    heads: i32,
    kv_heads: i32,
    scale: f32,
}

impl Attention {
    fn load(ctx: &mut LoadCtx, p: &str, a: &Args) -> Result<Self> {
        let (q_width, kv_width) = (a.heads * a.head_dim, a.kv_heads * a.head_dim);
        let proj = |ctx: &mut LoadCtx, name: &str, out: usize, inp: usize| {
            Linear::load(ctx, &format!("{p}.{name}"), out, inp, false)
        };
        Ok(Self {
            q: proj(ctx, "q_proj", q_width, a.hidden)?,
            k: proj(ctx, "k_proj", kv_width, a.hidden)?,
            v: if a.k_eq_v { None } else { Some(proj(ctx, "v_proj", kv_width, a.hidden)?) },
            o: proj(ctx, "o_proj", a.hidden, q_width)?,
            q_norm: RmsNorm::load(ctx, &format!("{p}.q_norm"), a.head_dim, a.eps)?,
            k_norm: RmsNorm::load(ctx, &format!("{p}.k_norm"), a.head_dim, a.eps)?,
            heads: a.heads as i32,
            kv_heads: a.kv_heads as i32,
            scale: a.attention_scale,
        })
    }

    /// Keys (normed, rotated) and values `[1, kvH, L, D]` of `x`.
    fn kv(&self, x: &Array, rope: &Rope, at: i32) -> Result<(Array, Array)> {
        let l = x.shape()[1];
        let raw = self.k.forward(x)?.reshape(&[1, l, self.kv_heads, -1])?;
        let v = match &self.v {
            Some(v) => v.forward(x)?.reshape(&[1, l, self.kv_heads, -1])?,
            None => raw.clone(),
        };
        let k = rope.apply(&self.k_norm.forward(&raw)?.transpose_axes(&[0, 2, 1, 3])?, &Position::Offset(at))?;
        Ok((k, v.transpose_axes(&[0, 2, 1, 3])?))
    }

    fn forward(
        &self,
        x: &Array,
        context: &Array,
        rope: &Rope,
        at: Positions,
        causal: bool,
        cache: &mut CacheBox,
    ) -> Result<Array> {
        let l = x.shape()[1];
        let q = self.q_norm.forward(&self.q.forward(x)?.reshape(&[1, l, self.heads, -1])?)?;
        let q = rope.apply(&q.transpose_axes(&[0, 2, 1, 3])?, &Position::Offset(at.block))?;
        let (ck, cv) = self.kv(context, rope, at.context)?;
        let (ck, cv) = update(cache, ck, cv)?;
        let (bk, bv) = self.kv(x, rope, at.block)?;
        let keys = ops::concatenate(&[ck, bk], 2)?;
        let values = ops::concatenate(&[cv, bv], 2)?;
        let mask = if causal { causal_mask(l, keys.shape()[2])? } else { Mask::None };
        let out = sdpa(&q, &keys, &values, self.scale, &mask)?;
        self.o.forward(&out.transpose_axes(&[0, 2, 1, 3])?.reshape(&[1, l, -1])?)
    }
}

/// Query `i` of `l` sees the first `keys - l + i + 1` keys.
fn causal_mask(l: i32, keys: i32) -> Result<Mask> {
    let q = Array::arange::<_, i32>(keys - l, keys, 1)?.reshape(&[l, 1])?;
    let k = Array::arange::<_, i32>(0, keys, 1)?.reshape(&[1, keys])?;
    Ok(Mask::Array(k.le(&q)?))
}

/// Where the new context rows and the block start.
#[derive(Clone, Copy)]
pub struct Positions {
    pub context: i32,
    pub block: i32,
}

struct Layer {
    attn: Attention,
    mlp: Mlp,
    input_norm: RmsNorm,
    /// Qwen3: before the MLP; Gemma 4: on the attention's output.
    post_norm: RmsNorm,
    gemma: Option<GemmaParts>,
}

/// What a Gemma 4 layer adds: the norms around its MLP and the scalar on
/// its output.
struct GemmaParts {
    pre_ff_norm: RmsNorm,
    post_ff_norm: RmsNorm,
    scalar: Array,
}

impl Layer {
    fn load(ctx: &mut LoadCtx, p: &str, a: &Args) -> Result<Self> {
        let h = a.hidden;
        let norm = |ctx: &mut LoadCtx, name: &str| RmsNorm::load(ctx, &format!("{p}.{name}"), h, a.eps);
        let (mlp, gemma) = match a.backbone {
            Backbone::Qwen3 => (Mlp::load(ctx, &format!("{p}.mlp"), h, a.intermediate, false)?, None),
            Backbone::Gemma4 => {
                let scalar = ctx.tensor(&format!("{p}.layer_scalar"), &[1])?;
                ctx.loaded.push(scalar.clone());
                let parts = GemmaParts {
                    pre_ff_norm: norm(ctx, "pre_feedforward_layernorm")?,
                    post_ff_norm: norm(ctx, "post_feedforward_layernorm")?,
                    scalar,
                };
                (Mlp::load_geglu(ctx, &format!("{p}.mlp"), h, a.intermediate)?, Some(parts))
            }
        };
        Ok(Self {
            attn: Attention::load(ctx, &format!("{p}.self_attn"), a)?,
            mlp,
            input_norm: norm(ctx, "input_layernorm")?,
            post_norm: norm(ctx, "post_attention_layernorm")?,
            gemma,
        })
    }

    fn forward(
        &self,
        h: &Array,
        context: &Array,
        rope: &Rope,
        at: Positions,
        causal: bool,
        cache: &mut CacheBox,
    ) -> Result<Array> {
        let r = self.attn.forward(&self.input_norm.forward(h)?, context, rope, at, causal, cache)?;
        match &self.gemma {
            None => {
                let h1 = h.add(&r)?;
                h1.add(&self.mlp.forward(&self.post_norm.forward(&h1)?)?)
            }
            Some(g) => {
                let h1 = h.add(&self.post_norm.forward(&r)?)?;
                let m = g.post_ff_norm.forward(&self.mlp.forward(&g.pre_ff_norm.forward(&h1)?)?)?;
                h1.add(&m)?.multiply(&g.scalar)
            }
        }
    }
}

pub struct Block {
    fc: Linear,
    hidden_norm: RmsNorm,
    layers: Vec<Layer>,
    norm: RmsNorm,
    rope: Rope,
    causal: bool,
}

impl Block {
    pub fn load(ctx: &mut LoadCtx, a: &Args) -> Result<Self> {
        let h = a.hidden;
        let layers = (0..a.layers).map(|i| Layer::load(ctx, &format!("layers.{i}"), a)).collect::<Result<Vec<_>>>()?;
        let rope = Rope::new(a.head_dim as i32, a.rope_theta, a.rope_traditional, a.rope_scaling.as_ref())?;
        if let Some(f) = rope.freqs() {
            ctx.loaded.push(f.clone());
        }
        Ok(Self {
            fc: Linear::load(ctx, "fc", h, a.target_layer_ids.len() * h, false)?,
            hidden_norm: RmsNorm::load(ctx, "hidden_norm", h, a.eps)?,
            layers,
            norm: RmsNorm::load(ctx, "norm", h, a.eps)?,
            rope,
            causal: a.causal,
        })
    }

    /// The block's output `[1, W, H]` from its input embeddings `[1, W, H]`
    /// and the new context taps `[1, S, n·H]` (appended to `caches`).
    pub fn forward(&self, block: &Array, taps: &Array, at: Positions, caches: &mut [CacheBox]) -> Result<Array> {
        let context = self.hidden_norm.forward(&self.fc.forward(taps)?)?;
        let mut h = block.clone();
        for (layer, cache) in self.layers.iter().zip(caches.iter_mut()) {
            h = layer.forward(&h, &context, &self.rope, at, self.causal, cache)?;
        }
        self.norm.forward(&h)
    }

    /// Context rows `[1, S, n·H]` at positions `first..` into `caches`
    /// alone (no block): what `forward` would store for them. Returns the
    /// stored arrays, to evaluate.
    pub fn absorb(&self, taps: &Array, first: i32, caches: &mut [CacheBox]) -> Result<Vec<Array>> {
        let context = self.hidden_norm.forward(&self.fc.forward(taps)?)?;
        let mut out = Vec::with_capacity(2 * self.layers.len());
        for (layer, cache) in self.layers.iter().zip(caches.iter_mut()) {
            let (k, v) = layer.attn.kv(&context, &self.rope, first)?;
            let (k, v) = update(cache, k, v)?;
            out.extend([k, v]);
        }
        Ok(out)
    }

    pub fn layers(&self) -> usize {
        self.layers.len()
    }
}
