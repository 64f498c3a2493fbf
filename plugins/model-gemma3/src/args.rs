//! config.json → the graph's hyper-parameters, with mlx-lm's
//! `gemma3_text.ModelArgs` defaults and reading rules.

use model_kit::config::Config;
use model_kit::{error, Result};
use plugin_api::ModelPlan;
use serde_json::Value;

pub const MODEL_TYPES: &[&str] = &["gemma3_text"];

pub struct Args {
    pub hidden: usize,
    /// The MLP's intermediate size.
    pub intermediate: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    pub vocab_size: usize,
    pub rope_theta: f32,
    pub rope_local_base_freq: f32,
    pub rope_scaling: Option<Value>,
    pub query_pre_attn_scalar: f64,
    /// Per layer: sliding-window attention (`(i + 1) % sliding_window_pattern != 0`).
    pub sliding: Vec<bool>,
    pub sliding_window: usize,
    pub max_position_embeddings: usize,
}

fn num_or(cfg: &Config, key: &str, default: f64) -> Result<f64> {
    match cfg.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => v.as_f64().ok_or_else(|| error(format!("config.json: `{key}` must be a number"))),
    }
}

impl Args {
    pub fn from_config(cfg: &Config) -> Result<Self> {
        let model_type = cfg.str("model_type").ok_or_else(|| error("config.json: `model_type` is required"))?;
        if !MODEL_TYPES.contains(&model_type) {
            return Err(error(format!("model_type `{model_type}` is not served by model-gemma3")));
        }
        // Defaults as mlx-lm's gemma3_text.ModelArgs.
        let usize_or = |k: &str, d: usize| -> Result<usize> { Ok(cfg.opt_usize(k)?.unwrap_or(d)) };
        let hidden = usize_or("hidden_size", 1152)?;
        let layers = usize_or("num_hidden_layers", 26)?;
        let heads = usize_or("num_attention_heads", 4)?;
        let kv_heads = usize_or("num_key_value_heads", 1)?;
        if kv_heads == 0 || heads % kv_heads != 0 {
            return Err(error(format!(
                "num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}"
            )));
        }
        let intermediate = usize_or("intermediate_size", 6912)?;
        let pattern = usize_or("sliding_window_pattern", 6)?;
        if pattern == 0 {
            return Err(error("config.json: `sliding_window_pattern` must be >= 1"));
        }
        // mlx-lm reads the global layers' mask from cache[pattern - 1].
        if layers < pattern {
            return Err(error(format!(
                "num_hidden_layers {layers} < sliding_window_pattern {pattern}: no global layer"
            )));
        }
        let sliding: Vec<bool> = (0..layers).map(|i| (i + 1) % pattern != 0).collect();
        let sliding_window = usize_or("sliding_window", 512)?;
        if sliding.contains(&true) && sliding_window == 0 {
            return Err(error("config.json: `sliding_window` must be > 0"));
        }
        Ok(Self {
            hidden,
            intermediate,
            layers,
            heads,
            kv_heads,
            head_dim: usize_or("head_dim", 256)?,
            rms_norm_eps: cfg.f32_or("rms_norm_eps", 1e-6)?,
            vocab_size: usize_or("vocab_size", 262144)?,
            rope_theta: num_or(cfg, "rope_theta", 1_000_000.0)? as f32,
            rope_local_base_freq: num_or(cfg, "rope_local_base_freq", 10_000.0)? as f32,
            rope_scaling: cfg.get("rope_scaling").cloned().filter(|v| !v.is_null()),
            query_pre_attn_scalar: num_or(cfg, "query_pre_attn_scalar", 256.0)?,
            sliding,
            sliding_window,
            max_position_embeddings: usize_or("max_position_embeddings", 32768)?,
        })
    }

    /// The per-layer cache needs and model facts, from config alone.
    pub fn plan(&self, cfg: &Config) -> ModelPlan {
        model_kit::graph::attention_plan(
            cfg,
            &model_kit::graph::AttentionShape {
                sliding: &self.sliding,
                window: self.sliding_window,
                kv_heads: self.kv_heads,
                head_dim: self.head_dim,
                vocab_size: self.vocab_size,
                hidden: self.hidden,
                max_context: self.max_position_embeddings,
            },
        )
    }
}
