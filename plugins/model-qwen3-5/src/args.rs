//! config.json → the graph's hyper-parameters, read as mlx-lm's
//! `qwen3_5.TextModelArgs` reads them: from `text_config` when the folder
//! is the multimodal checkpoint, else from the top level, with its defaults
//! and its `rope_parameters` rules.

use model_kit::config::Config;
use model_kit::{error, Result};
use plugin_api::{caps, Dtype, LayerNeed, ModelPlan};
use plugin_sdk::rstrings;
use serde_json::{json, Value};

pub const MODEL_TYPES: &[&str] = &["qwen3_5", "qwen3_5_moe"];

/// The sparse MLP of every layer when `num_experts > 0`.
#[derive(Clone, Copy)]
pub struct Moe {
    pub experts: usize,
    pub top_k: usize,
    /// Each expert's intermediate size (`moe_intermediate_size`).
    pub inter: usize,
    /// The shared expert's (`shared_expert_intermediate_size`).
    pub shared_inter: usize,
    pub norm_topk_prob: bool,
}

/// Gated DeltaNet geometry (the `linear_*` keys).
#[derive(Clone, Copy)]
pub struct Linear {
    pub k_heads: usize,
    pub v_heads: usize,
    pub k_dim: usize,
    pub v_dim: usize,
    pub conv_kernel: usize,
}

impl Linear {
    pub fn key_dim(&self) -> usize {
        self.k_heads * self.k_dim
    }

    pub fn value_dim(&self) -> usize {
        self.v_heads * self.v_dim
    }

    /// Channels of the causal conv: q, k and v side by side.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }
}

pub struct Args {
    pub hidden: usize,
    /// The dense MLP's intermediate size.
    pub intermediate: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    pub vocab_size: usize,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    pub attention_bias: bool,
    pub linear: Linear,
    /// Per layer: gated DeltaNet (else gated full attention), i.e.
    /// `(i + 1) % full_attention_interval != 0`.
    pub is_linear: Vec<bool>,
    pub rope_theta: f32,
    /// `int(head_dim * partial_rotary_factor)`.
    pub rope_dims: usize,
    pub rope_scaling: Option<Value>,
    /// None: a dense SwiGLU MLP in every layer.
    pub moe: Option<Moe>,
    pub weights_dtype: Dtype,
}

/// A non-negative integer (zero allowed, unlike `Config::usize`).
fn count_or(cfg: &Config, key: &str, default: usize) -> Result<usize> {
    match cfg.get(key) {
        None => Ok(default),
        Some(v) => v
            .as_u64()
            .filter(|n| *n < (1 << 31))
            .map(|n| n as usize)
            .ok_or_else(|| error(format!("config.json: `{key}` must be a non-negative integer, got {v}"))),
    }
}

fn num_or(v: Option<&Value>, key: &str, default: f64) -> Result<f64> {
    match v {
        None | Some(Value::Null) => Ok(default),
        Some(x) => x.as_f64().ok_or_else(|| error(format!("config.json: `{key}` must be a number, got {x}"))),
    }
}

fn dtype_of(name: Option<&str>) -> Option<Dtype> {
    match name? {
        "bfloat16" => Some(Dtype::BFLOAT16),
        "float16" => Some(Dtype::FLOAT16),
        "float32" => Some(Dtype::FLOAT32),
        _ => None,
    }
}

impl Args {
    /// The gated attention layers' geometry.
    pub fn attention_shape(&self, shift_norms: bool) -> model_kit::gated_attention::GatedAttentionShape<'_> {
        model_kit::gated_attention::GatedAttentionShape {
            hidden: self.hidden,
            heads: self.heads,
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
            bias: self.attention_bias,
            rms_norm_eps: self.rms_norm_eps,
            rope_dims: self.rope_dims,
            rope_theta: self.rope_theta,
            rope_scaling: self.rope_scaling.as_ref(),
            shift_norms,
        }
    }

    pub fn from_config(top: &Config) -> Result<Self> {
        let model_type = top.str("model_type").ok_or_else(|| error("config.json: `model_type` is required"))?;
        if !MODEL_TYPES.contains(&model_type) {
            return Err(error(format!("model_type `{model_type}` is not served by model-qwen3-5")));
        }
        let text = match top.get("text_config") {
            Some(t @ Value::Object(_)) => Config(t.clone()),
            Some(_) => return Err(error("config.json: `text_config` must be an object")),
            None => Config(top.0.clone()),
        };
        let cfg = &text;
        let usize_or = |k: &str, d: usize| -> Result<usize> { Ok(cfg.opt_usize(k)?.unwrap_or(d)) };
        let hidden = usize_or("hidden_size", 4096)?;
        let layers = usize_or("num_hidden_layers", 32)?;
        let heads = usize_or("num_attention_heads", 32)?;
        let kv_heads = usize_or("num_key_value_heads", 8)?;
        if heads % kv_heads != 0 {
            return Err(error(format!(
                "num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}"
            )));
        }
        let head_dim = usize_or("head_dim", hidden / heads)?;
        let linear = Linear {
            k_heads: usize_or("linear_num_key_heads", 16)?,
            v_heads: usize_or("linear_num_value_heads", 64)?,
            k_dim: usize_or("linear_key_head_dim", 192)?,
            v_dim: usize_or("linear_value_head_dim", 128)?,
            conv_kernel: usize_or("linear_conv_kernel_dim", 4)?,
        };
        if !linear.v_heads.is_multiple_of(linear.k_heads) {
            return Err(error(format!(
                "linear_num_value_heads {} must be divisible by linear_num_key_heads {}",
                linear.v_heads, linear.k_heads
            )));
        }
        if linear.conv_kernel < 2 {
            return Err(error("config.json: `linear_conv_kernel_dim` must be at least 2"));
        }
        if linear.conv_dim() >= 1 << 31 || head_dim * heads * 2 >= 1 << 31 {
            return Err(error("config.json: linear-attention or attention widths overflow"));
        }
        let interval = usize_or("full_attention_interval", 4)?;
        let is_linear: Vec<bool> = (0..layers).map(|i| (i + 1) % interval != 0).collect();
        // mlx-lm: a missing `rope_parameters` is its default dict (theta 1e5,
        // factor 0.25), which then overrides the top-level `rope_theta` and
        // `partial_rotary_factor`; an explicit null falls back to those.
        let rope = match cfg.0.get("rope_parameters") {
            None => Some(
                json!({"type": "default", "mrope_section": [11, 11, 10], "rope_theta": 100000, "partial_rotary_factor": 0.25}),
            ),
            Some(Value::Object(m)) if !m.is_empty() => Some(Value::Object(m.clone())),
            Some(Value::Null | Value::Object(_)) => None,
            Some(_) => return Err(error("config.json: `rope_parameters` must be an object")),
        };
        let (rope_theta, factor, rope_scaling) = match rope {
            Some(mut p) => {
                if p.get("type").is_none() {
                    if let Some(t) = p.as_object_mut().and_then(|m| m.remove("rope_type")) {
                        p["type"] = t;
                    }
                }
                (
                    num_or(p.get("rope_theta"), "rope_theta", 100000.0)?,
                    num_or(p.get("partial_rotary_factor"), "partial_rotary_factor", 0.25)?,
                    Some(p),
                )
            }
            None => (
                num_or(cfg.get("rope_theta"), "rope_theta", 100000.0)?,
                num_or(cfg.get("partial_rotary_factor"), "partial_rotary_factor", 0.25)?,
                cfg.get("rope_scaling").cloned(),
            ),
        };
        let rope_dims = (head_dim as f64 * factor) as usize;
        if is_linear.contains(&false) && (rope_dims == 0 || !rope_dims.is_multiple_of(2) || rope_dims > head_dim) {
            return Err(error(format!("partial_rotary_factor {factor} gives {rope_dims} rotary dims of head_dim {head_dim} (need an even count > 0)")));
        }
        let moe = match count_or(cfg, "num_experts", 0)? {
            0 => None,
            experts => Some(Moe {
                experts,
                top_k: cfg.usize("num_experts_per_tok")?,
                inter: cfg.usize("moe_intermediate_size")?,
                shared_inter: cfg.usize("shared_expert_intermediate_size")?,
                norm_topk_prob: cfg.bool_or("norm_topk_prob", true)?,
            }),
        };
        if let Some(m) = moe.filter(|m| m.top_k > m.experts) {
            return Err(error(format!("num_experts_per_tok {} exceeds num_experts {}", m.top_k, m.experts)));
        }
        let weights_dtype = dtype_of(top.str("torch_dtype").or_else(|| top.str("dtype")))
            .or_else(|| dtype_of(cfg.str("torch_dtype").or_else(|| cfg.str("dtype"))))
            .unwrap_or(Dtype::FLOAT32);
        Ok(Self {
            hidden,
            intermediate: usize_or("intermediate_size", 14336)?,
            layers,
            heads,
            kv_heads,
            head_dim,
            rms_norm_eps: cfg.f32_or("rms_norm_eps", 1e-6)?,
            vocab_size: usize_or("vocab_size", 151936)?,
            max_position_embeddings: usize_or("max_position_embeddings", 131072)?,
            tie_word_embeddings: cfg.bool_or("tie_word_embeddings", false)?,
            attention_bias: cfg.bool_or("attention_bias", false)?,
            linear,
            is_linear,
            rope_theta: rope_theta as f32,
            rope_dims,
            rope_scaling,
            moe,
            weights_dtype,
        })
    }

    /// One need per layer: the recurrent state of a DeltaNet layer (conv
    /// window `[K-1, conv_dim]`, SSM state `[Hv, Dv, Dk]`), K/V of an
    /// attention layer.
    pub fn plan(&self, top: &Config) -> ModelPlan {
        let l = &self.linear;
        let layers = self
            .is_linear
            .iter()
            .map(|&lin| match lin {
                true => LayerNeed::recurrent(vec![
                    vec![(l.conv_kernel - 1) as i64, l.conv_dim() as i64],
                    vec![l.v_heads as i64, l.v_dim as i64, l.k_dim as i64],
                ]),
                false => LayerNeed::full(self.kv_heads as u32, self.head_dim as u32),
            })
            .collect();
        let quant = top.quantization().ok().flatten();
        ModelPlan {
            layers,
            vocab_size: self.vocab_size as u32,
            hidden_size: self.hidden as u32,
            max_context: self.max_position_embeddings as u32,
            weights_dtype: self.weights_dtype,
            quant_bits: quant.as_ref().map_or(0, |q| q.default.bits as u32),
            quant_group_size: quant.as_ref().map_or(0, |q| q.default.group_size as u32),
            capabilities: rstrings(&[
                caps::CONTINUOUS_BATCHING,
                caps::HIDDEN_TAPS,
                caps::SHARED_EMBEDDINGS,
                caps::GROUPED_SPECULATIVE,
            ]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: Value) -> Result<Args> {
        Args::from_config(&Config(v))
    }

    #[test]
    fn flat_and_nested_configs_read_alike() {
        let text = json!({"hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
            "full_attention_interval": 2, "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
            "linear_value_head_dim": 8, "vocab_size": 100, "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25}});
        let mut flat = text.clone();
        flat["model_type"] = json!("qwen3_5");
        let nested = json!({"model_type": "qwen3_5", "torch_dtype": "bfloat16", "text_config": text});
        for a in [args(flat).unwrap(), args(nested).unwrap()] {
            assert_eq!(a.is_linear, [true, false, true, false]);
            assert_eq!((a.rope_dims, a.rope_theta, a.linear.conv_dim()), (4, 1e7, 2 * 32 + 32));
            assert_eq!(a.rope_scaling.as_ref().unwrap()["type"], "default");
        }
    }

    #[test]
    fn rope_parameters_default_overrides_the_top_level_keys_unless_null() {
        let base = json!({"model_type": "qwen3_5", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "rope_theta": 5.0, "partial_rotary_factor": 0.5});
        let a = args(base.clone()).unwrap();
        assert_eq!((a.rope_theta, a.rope_dims), (100000.0, 4));
        let mut explicit_null = base;
        explicit_null["rope_parameters"] = Value::Null;
        let a = args(explicit_null).unwrap();
        assert_eq!((a.rope_theta, a.rope_dims), (5.0, 8));
    }

    #[test]
    fn bad_geometry_is_refused() {
        for bad in [
            json!({"model_type": "qwen3_5", "linear_num_key_heads": 3, "linear_num_value_heads": 4}),
            json!({"model_type": "qwen3_5", "linear_conv_kernel_dim": 1}),
            json!({"model_type": "qwen3_5_moe", "num_experts": 8}),
            json!({"model_type": "qwen3_5_moe", "num_experts": 2, "num_experts_per_tok": 3, "moe_intermediate_size": 8}),
            json!({"model_type": "qwen3_5", "head_dim": 6, "rope_parameters": {"partial_rotary_factor": 0.5}}),
            json!({"model_type": "llama"}),
            json!({"model_type": "qwen3_5", "text_config": 3}),
        ] {
            assert!(args(bad.clone()).is_err(), "{bad}");
        }
    }
}
