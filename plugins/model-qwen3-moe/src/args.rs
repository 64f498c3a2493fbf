//! config.json → the graph's hyper-parameters, read as mlx-lm's
//! `qwen3_moe.ModelArgs` reads them (every field it requires is required).

use model_kit::config::Config;
use model_kit::{error, Result};
use plugin_api::ModelPlan;
use serde_json::Value;

pub const MODEL_TYPE: &str = "qwen3_moe";

pub struct Args {
    pub hidden: usize,
    /// The dense layers' MLP width.
    pub intermediate: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    pub vocab_size: usize,
    pub rope_theta: f32,
    pub tie_word_embeddings: bool,
    pub num_experts: usize,
    pub top_k: usize,
    pub moe_intermediate_size: usize,
    pub norm_topk_prob: bool,
    /// Per layer: a sparse MoE block (else the dense MLP).
    pub sparse: Vec<bool>,
    pub max_position_embeddings: usize,
}

impl Args {
    pub fn from_config(cfg: &Config) -> Result<Self> {
        let model_type = cfg.str("model_type").ok_or_else(|| error("config.json: `model_type` is required"))?;
        if model_type != MODEL_TYPE {
            return Err(error(format!("model_type `{model_type}` is not served by model-qwen3-moe")));
        }
        let layers = cfg.usize("num_hidden_layers")?;
        let heads = cfg.usize("num_attention_heads")?;
        let kv_heads = cfg.usize("num_key_value_heads")?;
        if heads % kv_heads != 0 {
            return Err(error(format!(
                "num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}"
            )));
        }
        let num_experts = cfg.usize("num_experts")?;
        let top_k = cfg.usize("num_experts_per_tok")?;
        if top_k > num_experts {
            return Err(error(format!("num_experts_per_tok {top_k} exceeds num_experts {num_experts}")));
        }
        // The dense layers' MLP width: required, as mlx-lm requires it.
        let intermediate = cfg.usize("intermediate_size")?;
        let step = cfg.usize("decoder_sparse_step")?;
        let mlp_only = match cfg.get("mlp_only_layers") {
            Some(Value::Array(v)) => v
                .iter()
                .map(|x| {
                    x.as_u64().ok_or_else(|| {
                        error(format!("config.json: `mlp_only_layers` must hold layer indices, got {x}"))
                    })
                })
                .collect::<Result<Vec<u64>>>()?,
            other => return Err(error(format!("config.json: `mlp_only_layers` must be a list, got {other:?}"))),
        };
        // mlx-lm: experts on layer i unless listed in mlp_only_layers, and only
        // every decoder_sparse_step-th layer.
        let sparse = (0..layers).map(|i| !mlp_only.contains(&(i as u64)) && (i + 1) % step == 0).collect();
        let rope_theta = cfg
            .get("rope_theta")
            .and_then(Value::as_f64)
            .ok_or_else(|| error("config.json: `rope_theta` is required (a number)"))?;
        let rms_norm_eps = cfg
            .get("rms_norm_eps")
            .and_then(Value::as_f64)
            .ok_or_else(|| error("config.json: `rms_norm_eps` is required (a number)"))?;
        Ok(Self {
            hidden: cfg.usize("hidden_size")?,
            intermediate,
            layers,
            heads,
            kv_heads,
            head_dim: cfg.usize("head_dim")?,
            rms_norm_eps: rms_norm_eps as f32,
            vocab_size: cfg.usize("vocab_size")?,
            rope_theta: rope_theta as f32,
            tie_word_embeddings: cfg
                .get("tie_word_embeddings")
                .and_then(Value::as_bool)
                .ok_or_else(|| error("config.json: `tie_word_embeddings` is required (true or false)"))?,
            num_experts,
            top_k,
            moe_intermediate_size: cfg.usize("moe_intermediate_size")?,
            norm_topk_prob: cfg
                .get("norm_topk_prob")
                .and_then(Value::as_bool)
                .ok_or_else(|| error("config.json: `norm_topk_prob` is required (true or false)"))?,
            sparse,
            max_position_embeddings: cfg.usize("max_position_embeddings")?,
        })
    }

    /// One full-attention cache per layer and the model facts, from config alone.
    pub fn plan(&self, cfg: &Config) -> ModelPlan {
        model_kit::graph::attention_plan(
            cfg,
            &model_kit::graph::AttentionShape {
                sliding: &vec![false; self.layers],
                window: 0,
                kv_heads: self.kv_heads,
                head_dim: self.head_dim,
                vocab_size: self.vocab_size,
                hidden: self.hidden,
                max_context: self.max_position_embeddings,
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra: &str) -> Config {
        let base = r#""model_type": "qwen3_moe", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-6, "vocab_size": 100, "rope_theta": 1e6,
            "tie_word_embeddings": true, "intermediate_size": 128, "num_experts": 8, "num_experts_per_tok": 2,
            "moe_intermediate_size": 32, "norm_topk_prob": true, "max_position_embeddings": 4096"#;
        Config::parse(&format!("{{{base}, {extra}}}")).unwrap()
    }

    #[test]
    fn sparse_layers_follow_the_step_and_the_dense_list() {
        let a = Args::from_config(&config(r#""decoder_sparse_step": 2, "mlp_only_layers": [3]"#)).unwrap();
        assert_eq!(a.sparse, [false, true, false, false]);
        let a = Args::from_config(&config(r#""decoder_sparse_step": 1, "mlp_only_layers": [0, 2]"#)).unwrap();
        assert_eq!(a.sparse, [false, true, false, true]);
    }

    #[test]
    fn refuses_what_mlx_lm_would_not_build() {
        let err = |extra: &str| Args::from_config(&config(extra)).err().expect("refused").what().to_owned();
        assert!(err(r#""decoder_sparse_step": 1"#).contains("mlp_only_layers"));
        assert!(err(r#""decoder_sparse_step": 0, "mlp_only_layers": []"#).contains("decoder_sparse_step"));
        assert!(err(r#""decoder_sparse_step": 1, "mlp_only_layers": [], "num_experts_per_tok": 9"#).contains("exceeds"));
    }
}
