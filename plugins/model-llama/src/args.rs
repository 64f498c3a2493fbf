//! config.json → the graph's hyper-parameters, with each model type's
//! defaults and quirks exactly as mlx-lm reads them.

use model_kit::config::Config;
use model_kit::{error, Result};
use plugin_api::ModelPlan;
use serde_json::Value;

pub const MODEL_TYPES: &[&str] = &["llama", "mistral", "qwen2", "qwen3", "smollm3"];

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
    pub rope_traditional: bool,
    pub rope_scaling: Option<Value>,
    pub tie_word_embeddings: bool,
    pub qkv_bias: bool,
    pub o_bias: bool,
    pub mlp_bias: bool,
    pub qk_norm: bool,
    /// Per layer: whether it applies RoPE (smollm3's NoPE layers do not).
    pub use_rope: Vec<bool>,
    /// Per layer: sliding-window attention (llama `layer_types`).
    pub sliding: Vec<bool>,
    pub sliding_window: usize,
    pub max_position_embeddings: usize,
}

impl Args {
    pub fn from_config(cfg: &Config) -> Result<Self> {
        let model_type = cfg.str("model_type").ok_or_else(|| error("config.json: `model_type` is required"))?;
        if !MODEL_TYPES.contains(&model_type) {
            return Err(error(format!("model_type `{model_type}` is not served by model-llama")));
        }
        let hidden = cfg.usize("hidden_size")?;
        let layers = cfg.usize("num_hidden_layers")?;
        let heads = cfg.usize("num_attention_heads")?;
        let kv_heads = cfg.opt_usize("num_key_value_heads")?.unwrap_or(heads);
        if heads % kv_heads != 0 {
            return Err(error(format!(
                "num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}"
            )));
        }
        let intermediate = cfg.usize("intermediate_size")?;
        let qwen3 = model_type == "qwen3";
        let qwen2 = model_type == "qwen2";
        // qwen2 always derives head_dim; qwen3 requires it; llama reads it if present.
        let head_dim = if qwen2 {
            hidden / heads
        } else if qwen3 {
            cfg.usize("head_dim")?
        } else {
            cfg.opt_usize("head_dim")?.unwrap_or(hidden / heads)
        };
        // transformers >= 5 nests rope settings under rope_parameters; mlx-lm's
        // qwen3 reads them there, its llama and qwen2 do not.
        let rope_params = if qwen3 { cfg.get("rope_parameters").cloned() } else { None };
        let default_theta = if qwen2 { 1_000_000.0 } else { 10_000.0 };
        let rope_theta = match cfg.get("rope_theta") {
            Some(v) => v.as_f64().ok_or_else(|| error("config.json: `rope_theta` must be a number"))? as f32,
            None => match rope_params.as_ref().and_then(|p| p.get("rope_theta")).and_then(Value::as_f64) {
                Some(t) => t as f32,
                None if qwen3 => return Err(error("rope_theta is missing from the model config")),
                None => default_theta,
            },
        };
        let rope_scaling = cfg.get("rope_scaling").cloned().or(rope_params);
        let tie_word_embeddings = if qwen3 {
            cfg.get("tie_word_embeddings")
                .and_then(Value::as_bool)
                .ok_or_else(|| error("config.json: `tie_word_embeddings` is required for qwen3"))?
        } else {
            cfg.bool_or("tie_word_embeddings", true)?
        };
        let attention_bias = cfg.bool_or("attention_bias", false)?;
        let (qkv_bias, o_bias) = match model_type {
            "qwen2" => (true, false),
            "qwen3" => (false, false),
            _ => (attention_bias, attention_bias),
        };
        let mlp_bias = if qwen2 || qwen3 { false } else { cfg.bool_or("mlp_bias", false)? };
        let use_rope = match model_type {
            "smollm3" => match cfg.get("no_rope_layers") {
                Some(Value::Array(v)) => {
                    if v.len() != layers {
                        return Err(error("`no_rope_layers` length mismatch"));
                    }
                    v.iter().map(|x| x.as_i64().unwrap_or(1) != 0).collect()
                }
                _ => {
                    let interval = cfg.opt_usize("no_rope_layer_interval")?.unwrap_or(4);
                    (0..layers).map(|i| (i + 1) % interval != 0).collect()
                }
            },
            _ => vec![true; layers],
        };
        let sliding: Vec<bool> = match (model_type, cfg.get("layer_types")) {
            ("llama" | "mistral" | "smollm3", Some(Value::Array(v))) => {
                if v.len() != layers {
                    return Err(error("`layer_types` length mismatch"));
                }
                v.iter().map(|t| t.as_str() == Some("sliding_attention")).collect()
            }
            _ => vec![false; layers],
        };
        if !sliding.contains(&false) {
            return Err(error("at least one full-attention layer is required"));
        }
        let sliding_window = if sliding.contains(&true) { cfg.usize("sliding_window")? } else { 0 };
        Ok(Self {
            hidden,
            intermediate,
            layers,
            heads,
            kv_heads,
            head_dim,
            rms_norm_eps: cfg.f32_or("rms_norm_eps", 1e-6)?,
            vocab_size: cfg.usize("vocab_size")?,
            rope_theta,
            rope_traditional: if qwen3 { false } else { cfg.bool_or("rope_traditional", false)? },
            rope_scaling,
            tie_word_embeddings,
            qkv_bias,
            o_bias,
            mlp_bias,
            qk_norm: qwen3,
            use_rope,
            sliding,
            sliding_window,
            max_position_embeddings: cfg.opt_usize("max_position_embeddings")?.unwrap_or(0),
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
