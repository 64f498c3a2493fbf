//! The assistant's config.json as mlx-vlm 0.7.10's `Gemma4AssistantConfig`
//! reads it: top-level keys (the target's width, the head's variant) and a
//! Gemma 4 `text_config` for the drafter's own layers, with that
//! `TextConfig`'s defaults. `block_size` (the verify width, 4) is not read:
//! the host's depth governs (`--num-draft-tokens`, by default the
//! manifest's 3, that width's drafts).

use model_kit::config::Config;
use model_kit::{error, Result};
use serde_json::{json, Value};

/// One drafter layer: its attention kind, head size and RoPE.
pub struct LayerArgs {
    pub sliding: bool,
    pub head_dim: usize,
    pub rope_theta: f32,
    /// The layer kind's `rope_parameters` entry (model-kit's `Rope` reads
    /// its `rope_type`, `partial_rotary_factor`, `factor`).
    pub rope: Value,
}

pub struct Args {
    /// The target's hidden size the head reads and writes.
    pub backbone_hidden: usize,
    pub hidden: usize,
    pub vocab_size: usize,
    pub intermediate: usize,
    pub heads: usize,
    pub eps: f32,
    pub rope_traditional: bool,
    /// The window of the sliding layers' bidirectional mask (the
    /// assistant's own `sliding_window`, as mlx-vlm reads it).
    pub sliding_window: usize,
    pub layers: Vec<LayerArgs>,
    pub tied: bool,
    /// The centroid head: (clusters, clusters kept per step).
    pub centroids: Option<(usize, usize)>,
}

impl Args {
    pub fn from_config(text: &str) -> Result<Self> {
        let top = Config::parse(text)?;
        let t = match top.get("text_config") {
            Some(t @ Value::Object(_)) => Config(t.clone()),
            _ => return Err(error("config.json: an assistant needs a `text_config` object")),
        };
        if t.bool_or("enable_moe_block", false)? {
            return Err(error("an assistant with MoE layers (enable_moe_block) is not built"));
        }
        let or = |c: &Config, k: &str, d: usize| -> Result<usize> { Ok(c.opt_usize(k)?.unwrap_or(d)) };
        let layers = or(&t, "num_hidden_layers", 35)?;
        let head_dim = or(&t, "head_dim", 256)?;
        // mlx-vlm: full layers use `global_head_dim` when it is set (and non-zero).
        let global = t.opt_usize("global_head_dim")?.filter(|&g| g > 0).unwrap_or(512);
        let types = layer_types(&t, layers)?;
        let rope = match t.get("rope_parameters") {
            Some(Value::Object(m)) => Value::Object(m.clone()),
            None | Some(Value::Null) => json!({
                "full_attention": {"partial_rotary_factor": 1.0, "rope_theta": 1000000.0, "rope_type": "proportional"},
                "sliding_attention": {"partial_rotary_factor": 1.0, "rope_theta": 10000.0, "rope_type": "default"},
            }),
            Some(_) => return Err(error("config.json: `rope_parameters` must be an object")),
        };
        let layers = types
            .iter()
            .map(|&sliding| {
                let key = if sliding { "sliding_attention" } else { "full_attention" };
                let params = rope.get(key).cloned().unwrap_or_else(|| json!({}));
                let theta = params.get("rope_theta").and_then(Value::as_f64).unwrap_or(10000.0) as f32;
                LayerArgs {
                    sliding,
                    head_dim: if sliding { head_dim } else { global },
                    rope_theta: theta,
                    rope: params,
                }
            })
            .collect();
        let centroids = match top.bool_or("use_ordered_embeddings", false)? {
            true => Some((or(&top, "num_centroids", 2048)?, or(&top, "centroid_intermediate_top_k", 32)?)),
            false => None,
        };
        let hidden = or(&t, "hidden_size", 1536)?;
        Ok(Self {
            backbone_hidden: or(&top, "backbone_hidden_size", 1536)?,
            hidden,
            vocab_size: or(&t, "vocab_size", 262144)?,
            intermediate: or(&t, "intermediate_size", 6144)?,
            heads: or(&t, "num_attention_heads", 8)?,
            eps: t.f32_or("rms_norm_eps", 1e-6)?,
            rope_traditional: t.bool_or("rope_traditional", false)?,
            sliding_window: or(&t, "sliding_window", 512)?.max(1),
            layers,
            tied: top.bool_or("tie_word_embeddings", true)?,
            centroids,
        })
    }
}

/// `layer_types` (true = sliding), or the pattern `TextConfig` derives from
/// `sliding_window_pattern`: that many layers, the last of them full.
fn layer_types(t: &Config, layers: usize) -> Result<Vec<bool>> {
    match t.get("layer_types") {
        Some(Value::Array(a)) => {
            if a.len() != layers {
                return Err(error(format!("config.json: {} layer_types for {layers} layers", a.len())));
            }
            a.iter()
                .map(|v| match v.as_str() {
                    Some("sliding_attention") => Ok(true),
                    Some("full_attention") => Ok(false),
                    _ => Err(error(format!("config.json: unknown layer type {v}"))),
                })
                .collect()
        }
        None | Some(Value::Null) => {
            let pattern = t.opt_usize("sliding_window_pattern")?.unwrap_or(5).max(1);
            Ok((0..layers).map(|i| (i + 1) % pattern != 0).collect())
        }
        Some(_) => Err(error("config.json: `layer_types` must be a list")),
    }
}
