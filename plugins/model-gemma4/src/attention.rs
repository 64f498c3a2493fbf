//! Gemma 4 attention: q/k RMSNorms and a scale-free v norm over the head
//! dim, RoPE per attention type, attention scale 1, K = V on full layers
//! with `attention_k_eq_v`, and KV sharing: a shared layer has only q/o
//! projections and attends over the keys/values (and RoPE position) of an
//! earlier layer of its type.

use crate::args::Args;
use model_kit::attention::{positions, sdpa, update, Mask};
use model_kit::layers::{Linear, LoadCtx, RmsNorm};
use model_kit::rope::{Position, Rope};
use model_kit::{Array, Result};
use plugin_api::CacheBox;

/// What a cached layer hands on to the layers that share its keys/values:
/// everything it attended over, and the position its new tokens had.
pub struct SharedKv {
    keys: Array,
    values: Array,
    pos: Position,
}

impl SharedKv {
    fn position(&self) -> Position {
        match &self.pos {
            Position::Offset(o) => Position::Offset(*o),
            Position::PerRow(a) => Position::PerRow(a.clone()),
        }
    }
}

/// Where a layer's keys/values come from.
pub enum KvSource<'a> {
    Own(&'a mut CacheBox),
    Shared(&'a SharedKv),
}

/// The projections of a layer with keys/values of its own.
struct KvProj {
    k: Linear,
    /// None with K = V: the values are the keys' projection.
    v: Option<Linear>,
    k_norm: RmsNorm,
}

pub struct Attention {
    q: Linear,
    o: Linear,
    q_norm: RmsNorm,
    kv: Option<KvProj>,
    rope: Rope,
    heads: i32,
    kv_heads: i32,
    eps: f32,
}

impl Attention {
    pub fn load(ctx: &mut LoadCtx, p: &str, a: &Args, layer: usize) -> Result<Self> {
        let kind = a.kind(layer);
        let eps = a.rms_norm_eps;
        let (q_width, kv_width) = (a.heads * kind.head_dim, kind.kv_heads * kind.head_dim);
        let proj = |ctx: &mut LoadCtx, name: &str, out: usize, inp: usize| {
            Linear::load(ctx, &format!("{p}.{name}"), out, inp, false)
        };
        let kv = if layer < a.cached {
            Some(KvProj {
                k: proj(ctx, "k_proj", kv_width, a.hidden)?,
                v: if kind.k_eq_v { None } else { Some(proj(ctx, "v_proj", kv_width, a.hidden)?) },
                k_norm: RmsNorm::load(ctx, &format!("{p}.k_norm"), kind.head_dim, eps)?,
            })
        } else {
            None
        };
        let rope = Rope::new(kind.head_dim as i32, kind.rope_theta, a.rope_traditional, Some(&kind.rope))?;
        if let Some(f) = rope.freqs() {
            ctx.loaded.push(f.clone());
        }
        Ok(Self {
            q: proj(ctx, "q_proj", q_width, a.hidden)?,
            o: proj(ctx, "o_proj", a.hidden, q_width)?,
            q_norm: RmsNorm::load(ctx, &format!("{p}.q_norm"), kind.head_dim, eps)?,
            kv,
            rope,
            heads: a.heads as i32,
            kv_heads: kind.kv_heads as i32,
            eps,
        })
    }

    /// The output, and (for a layer with its own cache) what sharing layers reuse.
    pub fn forward(&self, x: &Array, mask: &Mask, source: KvSource<'_>) -> Result<(Array, Option<SharedKv>)> {
        let (b, l) = (x.shape()[0], x.shape()[1]);
        let to_heads = |t: Array, n: i32| t.reshape(&[b, l, n, -1]);
        let q = self.q_norm.forward(&to_heads(self.q.forward(x)?, self.heads)?)?;
        let (keys, values, pos, shared) = match source {
            KvSource::Shared(s) => (s.keys.clone(), s.values.clone(), s.position(), false),
            KvSource::Own(cache) => {
                let kv = self.kv.as_ref().ok_or_else(|| model_kit::error("a KV-shared layer was given a cache"))?;
                let k = to_heads(kv.k.forward(x)?, self.kv_heads)?;
                let v = match &kv.v {
                    Some(v) => to_heads(v.forward(x)?, self.kv_heads)?,
                    None => k.clone(),
                };
                let pos = positions(cache)?;
                let k = self.rope.apply(&kv.k_norm.forward(&k)?.transpose_axes(&[0, 2, 1, 3])?, &pos)?;
                // RMSNormNoScale: the fused kernel with no weight.
                let v = mlx_rs::fast::rms_norm(&v, None, self.eps)?.transpose_axes(&[0, 2, 1, 3])?;
                let (k, v) = update(cache, k, v)?;
                (k, v, pos, true)
            }
        };
        let q = self.rope.apply(&q.transpose_axes(&[0, 2, 1, 3])?, &pos)?;
        let out = sdpa(&q, &keys, &values, 1.0, mask)?;
        let out = self.o.forward(&out.transpose_axes(&[0, 2, 1, 3])?.reshape(&[b, l, -1])?)?;
        Ok((out, shared.then_some(SharedKv { keys, values, pos })))
    }
}
