//! Gated full attention (mlx-lm `qwen3_next.Qwen3NextAttention`, used by
//! Qwen3-Next and Qwen3.5, and by Qwen3.5's multi-token-prediction layer):
//! q_proj yields the queries and a gate side by side per head, q/k RMSNorms
//! over the head, RoPE on the first `rope_dims` of each head, and the
//! attention output scaled by `sigmoid(gate)` before o_proj. K/V live in a
//! full-attention cache layout. On a GPU the norms and the rotation are one
//! kernel (`qk_norm_rope`).

use crate::attention::{attend, positions, Mask};
use crate::compiled::{self, Compiled};
use crate::fused_layers;
use crate::layers::{Linear, LoadCtx, RmsNorm};
use crate::qk_norm_rope;
use crate::rope::Rope;
use crate::{Array, Result};
use mlx_rs::ops;
use plugin_api::CacheBox;
use serde_json::Value;
use std::sync::OnceLock;

/// The geometry config.json implies.
pub struct GatedAttentionShape<'a> {
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub bias: bool,
    pub rms_norm_eps: f32,
    pub rope_dims: usize,
    pub rope_theta: f32,
    pub rope_scaling: Option<&'a Value>,
    /// Raw Hugging Face norms (stored minus one): see `RmsNorm::load_shifted`.
    pub shift_norms: bool,
}

pub struct GatedAttention {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    q_norm: RmsNorm,
    k_norm: RmsNorm,
    rope: Rope,
    heads: i32,
    kv_heads: i32,
    scale: f32,
}

impl GatedAttention {
    pub fn load(ctx: &mut LoadCtx, p: &str, a: &GatedAttentionShape) -> Result<Self> {
        let (q_width, kv_width) = (a.heads * a.head_dim, a.kv_heads * a.head_dim);
        let proj = |ctx: &mut LoadCtx, name: &str, out: usize, inp: usize| {
            Linear::load(ctx, &format!("{p}.{name}"), out, inp, a.bias)
        };
        let norm = |ctx: &mut LoadCtx, name: &str| {
            RmsNorm::load_shifted(ctx, &format!("{p}.{name}"), a.head_dim, a.rms_norm_eps, a.shift_norms)
        };
        Ok(Self {
            // The queries and their gate, side by side per head.
            q: proj(ctx, "q_proj", 2 * q_width, a.hidden)?,
            k: proj(ctx, "k_proj", kv_width, a.hidden)?,
            v: proj(ctx, "v_proj", kv_width, a.hidden)?,
            o: proj(ctx, "o_proj", a.hidden, q_width)?,
            q_norm: norm(ctx, "q_norm")?,
            k_norm: norm(ctx, "k_norm")?,
            rope: Rope::new(a.rope_dims as i32, a.rope_theta, false, a.rope_scaling)?,
            heads: a.heads as i32,
            kv_heads: a.kv_heads as i32,
            scale: (a.head_dim as f64).powf(-0.5) as f32,
        })
    }

    /// `x + attention(norm(x))`, the attention half of a pre-norm block: on
    /// a GPU decode step or short verify, the norm and q/k/v as one fused
    /// kernel and o with the residual as another (`fused_layers`), else
    /// the separate ops.
    pub fn forward_residual(&self, x: &Array, norm: &RmsNorm, mask: &Mask, cache: &mut CacheBox) -> Result<Array> {
        let qkv = fused_layers::norm_linears(x, norm, &[&self.q, &self.k, &self.v])?;
        let gated = self.gated(&qkv[0], &qkv[1], &qkv[2], mask, cache)?;
        fused_layers::linear_add(&gated, &self.o, x)
    }

    /// The attention output times `sigmoid(gate)`, from the projections.
    fn gated(&self, qg: &Array, k: &Array, v: &Array, mask: &Mask, cache: &mut CacheBox) -> Result<Array> {
        let (b, l) = (qg.shape()[0], qg.shape()[1]);
        let qg = qg.reshape(&[b, l, self.heads, -1])?.split_equal(2, -1)?;
        let k = k.reshape(&[b, l, self.kv_heads, -1])?;
        let v = v.reshape(&[b, l, self.kv_heads, -1])?.transpose_axes(&[0, 2, 1, 3])?;
        let pos = positions(cache)?;
        let (q, k) = match qk_norm_rope::fused_heads(&qg[0], &k, (&self.q_norm, &self.k_norm), &self.rope, &pos)? {
            Some(qk) => qk,
            None => {
                let q = self.q_norm.forward(&qg[0])?.transpose_axes(&[0, 2, 1, 3])?;
                let k = self.k_norm.forward(&k)?.transpose_axes(&[0, 2, 1, 3])?;
                (self.rope.apply(&q, &pos)?, self.rope.apply(&k, &pos)?)
            }
        };
        let out = attend(cache, &q, k, v, self.scale, mask)?.transpose_axes(&[0, 2, 1, 3])?;
        gate_output(&out, &qg[1])?.reshape(&[b, l, -1])
    }
}

/// `out * sigmoid(gate)` over `[B, L, heads, D]` views as they come (the
/// attention's transposed output, the gate's half of each query head): one
/// fused kernel with the ops' roundings, where the ops are a copy of the
/// gate, the sigmoid and the product.
fn gate_output(out: &Array, gate: &Array) -> Result<Array> {
    static F: OnceLock<Compiled> = OnceLock::new();
    compiled::cached(&F, |x| Ok(vec![x[0].multiply(ops::sigmoid(&x[1])?)?]))?.call1(&[out, gate])
}
