//! The MTP head (mlx-vlm `Qwen3_5MTPDraftModel`): one row per position p
//! from (the target's embedding of token p+1, the target's hidden state at
//! p after its final norm): `fc(concat[norm_e(embed), norm_h(hidden)])`,
//! then `mtp_num_hidden_layers` Qwen3.5 gated full-attention decoder layers
//! over the head's own KV cache, then `norm`. The target's LM head turns a
//! row into the logits of token p+2.

use model_kit::attention::Mask;
use model_kit::config::Config;
use model_kit::gated_attention::{GatedAttention, GatedAttentionShape};
use model_kit::layers::{Linear, LoadCtx, RmsNorm};
use model_kit::mlp::Mlp;
use model_kit::{error, fused_layers, Array, Result};
use plugin_api::CacheBox;
use plugin_sdk::mlx_rs::ops;
use serde_json::{json, Value};

/// The hyper-parameters, read from the head's text config as mlx-vlm's
/// Qwen3.5 `TextConfig` reads them.
pub struct Args {
    pub hidden: usize,
    pub vocab_size: usize,
    pub intermediate: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub eps: f32,
    pub bias: bool,
    pub rope_theta: f32,
    pub rope_dims: usize,
    pub rope_scaling: Option<Value>,
}

fn num(v: Option<&Value>, key: &str, default: f64) -> Result<f64> {
    match v {
        None | Some(Value::Null) => Ok(default),
        Some(x) => x.as_f64().ok_or_else(|| error(format!("config.json: `{key}` must be a number, got {x}"))),
    }
}

impl Args {
    pub fn from_config(text: &str) -> Result<Self> {
        let top = Config::parse(text)?;
        let cfg = match top.get("text_config") {
            Some(t @ Value::Object(_)) => Config(t.clone()),
            Some(_) => return Err(error("config.json: `text_config` must be an object")),
            None => top,
        };
        if cfg.opt_usize("num_experts")?.unwrap_or(0) > 0 {
            return Err(error("MoE MTP layers (num_experts > 0) are not supported by draft-mtp yet"));
        }
        let or = |k: &str, d: usize| -> Result<usize> { Ok(cfg.opt_usize(k)?.unwrap_or(d)) };
        let hidden = or("hidden_size", 4096)?;
        let heads = or("num_attention_heads", 32)?;
        let kv_heads = or("num_key_value_heads", 8)?;
        if !heads.is_multiple_of(kv_heads) {
            return Err(error(format!(
                "num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}"
            )));
        }
        let head_dim = or("head_dim", hidden / heads)?;
        // As the target family: a missing `rope_parameters` is the default
        // dict (theta 1e5, factor 0.25); an explicit null falls back to the
        // top-level keys.
        let rope = match cfg.0.get("rope_parameters") {
            None => Some(json!({"type": "default", "rope_theta": 100000, "partial_rotary_factor": 0.25})),
            Some(Value::Object(m)) if !m.is_empty() => Some(Value::Object(m.clone())),
            Some(Value::Null | Value::Object(_)) => None,
            Some(_) => return Err(error("config.json: `rope_parameters` must be an object")),
        };
        let (theta, factor, rope_scaling) = match rope {
            Some(mut p) => {
                if p.get("type").is_none() {
                    if let Some(t) = p.as_object_mut().and_then(|m| m.remove("rope_type")) {
                        p["type"] = t;
                    }
                }
                (
                    num(p.get("rope_theta"), "rope_theta", 1e5)?,
                    num(p.get("partial_rotary_factor"), "partial_rotary_factor", 0.25)?,
                    Some(p),
                )
            }
            None => (
                num(cfg.get("rope_theta"), "rope_theta", 1e5)?,
                num(cfg.get("partial_rotary_factor"), "partial_rotary_factor", 0.25)?,
                cfg.get("rope_scaling").cloned(),
            ),
        };
        let rope_dims = (head_dim as f64 * factor) as usize;
        if rope_dims == 0 || !rope_dims.is_multiple_of(2) || rope_dims > head_dim {
            return Err(error(format!(
                "partial_rotary_factor {factor} gives {rope_dims} rotary dims of head_dim {head_dim}"
            )));
        }
        Ok(Self {
            hidden,
            vocab_size: or("vocab_size", 0)?,
            intermediate: or("intermediate_size", 4 * hidden)?,
            layers: or("mtp_num_hidden_layers", 1)?.max(1),
            heads,
            kv_heads,
            head_dim,
            eps: cfg.f32_or("rms_norm_eps", 1e-6)?,
            bias: cfg.bool_or("attention_bias", false)?,
            rope_theta: theta as f32,
            rope_dims,
            rope_scaling,
        })
    }
}

struct Layer {
    attn: GatedAttention,
    mlp: Mlp,
    input_norm: RmsNorm,
    post_norm: RmsNorm,
}

pub struct Head {
    fc: Linear,
    norm_embed: RmsNorm,
    norm_hidden: RmsNorm,
    layers: Vec<Layer>,
    norm: RmsNorm,
}

impl Head {
    /// `at` gives a tensor's stored name from its `qwen3_5_mtp` name
    /// (`mtp.` in front inside a target checkpoint, speculators' names);
    /// `shift`: the norms are stored minus one (Hugging Face's layout).
    pub fn load(ctx: &mut LoadCtx, a: &Args, at: &dyn Fn(&str) -> String, shift: bool) -> Result<Self> {
        let h = a.hidden;
        let norm = |ctx: &mut LoadCtx, name: &str| RmsNorm::load_shifted(ctx, &at(name), h, a.eps, shift);
        let shape = GatedAttentionShape {
            hidden: h,
            heads: a.heads,
            kv_heads: a.kv_heads,
            head_dim: a.head_dim,
            bias: a.bias,
            rms_norm_eps: a.eps,
            rope_dims: a.rope_dims,
            rope_theta: a.rope_theta,
            rope_scaling: a.rope_scaling.as_ref(),
            shift_norms: shift,
        };
        let mut layers = Vec::with_capacity(a.layers);
        for i in 0..a.layers {
            layers.push(Layer {
                attn: GatedAttention::load(ctx, &at(&format!("layers.{i}.self_attn")), &shape)?,
                mlp: Mlp::load(ctx, &at(&format!("layers.{i}.mlp")), h, a.intermediate, false)?,
                input_norm: norm(ctx, &format!("layers.{i}.input_layernorm"))?,
                post_norm: norm(ctx, &format!("layers.{i}.post_attention_layernorm"))?,
            });
        }
        Ok(Self {
            fc: Linear::load(ctx, &at("fc"), h, 2 * h, false)?,
            norm_embed: norm(ctx, "pre_fc_norm_embedding")?,
            norm_hidden: norm(ctx, "pre_fc_norm_hidden")?,
            layers,
            norm: norm(ctx, "norm")?,
        })
    }

    /// Rows `[1, L, H]` from embeddings and hidden states `[1, L, H]`,
    /// appended to `caches` (one per layer). Each layer runs as the
    /// target family's blocks do (`forward_residual`): on a GPU decode step
    /// the norms, projections and residuals fused (`fused_layers`), else
    /// the separate ops in mlx-vlm's order.
    pub fn forward(&self, embed: &Array, hidden: &Array, caches: &mut [CacheBox]) -> Result<Array> {
        let x = ops::concatenate(&[self.norm_embed.forward(embed)?, self.norm_hidden.forward(hidden)?], -1)?;
        let mut h = fused_layers::linear(&x, &self.fc)?;
        let mask = Mask::for_cache(&caches[0], h.shape()[1])?;
        for (layer, cache) in self.layers.iter().zip(caches.iter_mut()) {
            let h1 = layer.attn.forward_residual(&h, &layer.input_norm, &mask, cache)?;
            h = layer.mlp.forward_residual(&layer.post_norm, &h1)?;
        }
        self.norm.forward(&h)
    }

    pub fn layers(&self) -> usize {
        self.layers.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_is_read_from_text_config_with_the_family_rope_rules() {
        let a = Args::from_config(
            r#"{"model_type": "qwen3_5_mtp", "text_config": {"hidden_size": 64, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 32, "mtp_num_hidden_layers": 1,
            "rope_parameters": {"rope_theta": 1e7, "partial_rotary_factor": 0.25}}}"#,
        )
        .unwrap();
        assert_eq!((a.hidden, a.vocab_size, a.layers, a.head_dim, a.rope_dims), (64, 32, 1, 16, 4));
        assert_eq!(a.rope_theta, 1e7);
        let e = Args::from_config(r#"{"text_config": {"num_experts": 4}}"#).err().unwrap();
        assert!(e.what().contains("MoE MTP layers"), "{}", e.what());
        let e = Args::from_config(r#"{"num_attention_heads": 5, "num_key_value_heads": 2}"#).err().unwrap();
        assert!(e.what().contains("not a multiple"), "{}", e.what());
    }
}
