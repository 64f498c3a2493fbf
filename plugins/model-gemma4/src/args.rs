//! config.json → the graph's hyper-parameters, with mlx-lm's
//! `gemma4_text.ModelArgs` defaults and reading rules (and `gemma4`'s
//! `text_config` unwrapping).
//!
//! mlx-lm distinguishes a missing key (the dataclass default) from `null`
//! (None): `global_head_dim: null` means "use head_dim",
//! `final_logit_softcapping: null` means "no cap",
//! `hidden_size_per_layer_input: null` means "no per-layer inputs". The
//! readers below keep that distinction.

use crate::moe::MoeArgs;
use model_kit::config::Config;
use model_kit::{error, Result};
use plugin_api::ModelPlan;
use serde_json::{json, Map, Value};

pub const MODEL_TYPES: &[&str] = &["gemma4_text", "gemma4"];
pub const ARCHITECTURES: &[&str] = &["Gemma4ForCausalLM", "Gemma4ForConditionalGeneration"];

/// The geometry of one attention type (index 0 = full, 1 = sliding, as
/// `model_kit::attention::masks_by_kind` orders masks).
pub struct Kind {
    pub head_dim: usize,
    pub kv_heads: usize,
    /// Values are the keys' projection (`attention_k_eq_v`, full layers only).
    pub k_eq_v: bool,
    /// `rope_parameters[<layer type>]` (`{}` when absent, as mlx-lm's `.get`).
    pub rope: Value,
    pub rope_theta: f32,
}

pub struct Args {
    pub hidden: usize,
    /// The dense MLP's intermediate size (twice that on KV-shared layers
    /// with `use_double_wide_mlp`: [`Args::mlp_width`]).
    pub intermediate: usize,
    pub double_wide_mlp: bool,
    pub layers: usize,
    pub heads: usize,
    pub rms_norm_eps: f32,
    pub vocab_size: usize,
    /// `hidden_size_per_layer_input` (0 = no per-layer input embeddings).
    pub per_layer_hidden: usize,
    pub vocab_size_per_layer: usize,
    pub sliding_window: usize,
    pub max_position_embeddings: usize,
    pub final_logit_softcapping: Option<f32>,
    pub rope_traditional: bool,
    pub tie_word_embeddings: bool,
    /// The expert branch beside each dense MLP (`enable_moe_block`).
    pub moe: Option<MoeArgs>,
    /// `[full, sliding]`.
    pub kinds: [Kind; 2],
    /// Per layer: sliding-window attention.
    pub sliding: Vec<bool>,
    /// Layers `0..cached` own a cache; the rest reuse another layer's K/V.
    pub cached: usize,
    /// Per layer: whose keys/values it attends over (itself when cached).
    pub kv_source: Vec<usize>,
}

/// A key as mlx-lm's dataclass sees it.
enum Field<'a> {
    Missing,
    Null,
    Set(&'a Value),
}

fn field<'a>(cfg: &'a Config, key: &str) -> Field<'a> {
    match cfg.0.get(key) {
        None => Field::Missing,
        Some(Value::Null) => Field::Null,
        Some(v) => Field::Set(v),
    }
}

/// A count that may be 0 (`num_kv_shared_layers`, `hidden_size_per_layer_input`).
fn count(v: &Value, key: &str) -> Result<usize> {
    v.as_u64()
        .filter(|n| *n < (1 << 31))
        .map(|n| n as usize)
        .ok_or_else(|| error(format!("config.json: `{key}` must be a non-negative integer, got {v}")))
}

fn number(v: &Value, key: &str) -> Result<f64> {
    v.as_f64().ok_or_else(|| error(format!("config.json: `{key}` must be a number, got {v}")))
}

/// mlx-lm's default `rope_parameters`.
fn default_rope_parameters() -> Value {
    json!({
        "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional"},
        "sliding_attention": {"partial_rotary_factor": 1.0, "rope_theta": 10000.0, "rope_type": "default"},
    })
}

/// The text model's config: config.json itself for `gemma4_text`; for the
/// multimodal `gemma4`, its `text_config` with the top-level `vocab_size`
/// (default 262144) written in, as mlx-lm's `gemma4.ModelArgs` does.
pub fn text_config(cfg: &Config) -> Result<Config> {
    match cfg.str("model_type") {
        Some("gemma4_text") => Ok(Config(cfg.0.clone())),
        Some("gemma4") => {
            let mut text = match cfg.0.get("text_config") {
                None | Some(Value::Null) => Map::new(),
                Some(Value::Object(m)) => m.clone(),
                Some(v) => return Err(error(format!("config.json: `text_config` must be an object, got {v}"))),
            };
            let vocab = cfg.get("vocab_size").cloned().unwrap_or(json!(262144));
            text.insert("vocab_size".into(), vocab);
            text.entry("num_attention_heads").or_insert(json!(8));
            text.entry("num_key_value_heads").or_insert(json!(1));
            Ok(Config(Value::Object(text)))
        }
        Some(other) => Err(error(format!("model_type `{other}` is not served by model-gemma4"))),
        None => Err(error("config.json: `model_type` is required")),
    }
}

impl Args {
    /// Reads the TEXT config (see [`text_config`]).
    pub fn from_config(cfg: &Config) -> Result<Self> {
        let usize_or = |k: &str, d: usize| -> Result<usize> { Ok(cfg.opt_usize(k)?.unwrap_or(d)) };
        let hidden = usize_or("hidden_size", 1536)?;
        let layers = usize_or("num_hidden_layers", 35)?;
        let heads = usize_or("num_attention_heads", 8)?;
        let head_dim = usize_or("head_dim", 256)?;
        let kv_heads = usize_or("num_key_value_heads", 1)?;
        let intermediate = usize_or("intermediate_size", 6144)?;
        let moe = if cfg.bool_or("enable_moe_block", false)? {
            let need = |k: &str| {
                cfg.opt_usize(k)?.ok_or_else(|| error(format!("config.json: `enable_moe_block` needs `{k}`")))
            };
            let m = MoeArgs {
                experts: need("num_experts")?,
                top_k: need("top_k_experts")?,
                inter: need("moe_intermediate_size")?,
            };
            if m.top_k > m.experts {
                return Err(error(format!("top_k_experts {} exceeds num_experts {}", m.top_k, m.experts)));
            }
            Some(m)
        } else {
            None
        };
        let global_head_dim = match field(cfg, "global_head_dim") {
            Field::Missing => 512,
            Field::Null => head_dim,
            Field::Set(v) => match count(v, "global_head_dim")? {
                0 => head_dim,
                n => n,
            },
        };
        let k_eq_v = cfg.bool_or("attention_k_eq_v", false)?;
        // num_global_key_value_heads only applies with attention_k_eq_v.
        let global_kv_heads = match cfg.opt_usize("num_global_key_value_heads")? {
            Some(n) if k_eq_v => n,
            _ => kv_heads,
        };
        for (what, n) in [("num_key_value_heads", kv_heads), ("num_global_key_value_heads", global_kv_heads)] {
            if heads % n != 0 {
                return Err(error(format!("num_attention_heads {heads} is not a multiple of {what} {n}")));
            }
        }

        let sliding = layer_types(cfg, layers)?;
        let sliding_window = usize_or("sliding_window", 512)?;
        let shared = match field(cfg, "num_kv_shared_layers") {
            Field::Missing => 20,
            Field::Null => 0,
            Field::Set(v) => count(v, "num_kv_shared_layers")?,
        };
        if shared >= layers {
            return Err(error(format!(
                "num_kv_shared_layers {shared} leaves no layer of the {layers} with keys/values of its own"
            )));
        }
        let cached = layers - shared;
        // Each shared layer reuses the last cached layer of its own type.
        let mut kv_source: Vec<usize> = (0..layers).collect();
        for j in cached..layers {
            kv_source[j] = (0..cached).rev().find(|&i| sliding[i] == sliding[j]).ok_or_else(|| {
                error(format!("layer {j} shares keys/values, but no earlier layer of its attention type has any"))
            })?;
        }

        let rope_parameters = match cfg.get("rope_parameters") {
            None => default_rope_parameters(),
            Some(v) if v.is_object() => v.clone(),
            Some(v) => return Err(error(format!("config.json: `rope_parameters` must be an object, got {v}"))),
        };
        let kind = |key: &str, head_dim: usize, kv_heads: usize, k_eq_v: bool| -> Result<Kind> {
            let rope = rope_parameters.get(key).cloned().unwrap_or_else(|| json!({}));
            if !rope.is_object() {
                return Err(error(format!("config.json: `rope_parameters.{key}` must be an object")));
            }
            let rope_theta = match rope.get("rope_theta") {
                None | Some(Value::Null) => 10000.0,
                Some(v) => number(v, "rope_theta")?,
            } as f32;
            Ok(Kind { head_dim, kv_heads, k_eq_v, rope, rope_theta })
        };
        let kinds = [
            kind("full_attention", global_head_dim, global_kv_heads, k_eq_v)?,
            kind("sliding_attention", head_dim, kv_heads, false)?,
        ];

        let per_layer_hidden = match field(cfg, "hidden_size_per_layer_input") {
            Field::Missing => 256,
            Field::Null => 0,
            Field::Set(v) => count(v, "hidden_size_per_layer_input")?,
        };
        let final_logit_softcapping = match field(cfg, "final_logit_softcapping") {
            Field::Missing => Some(30.0),
            Field::Null => None,
            Field::Set(v) => Some(number(v, "final_logit_softcapping")? as f32),
        };
        Ok(Self {
            hidden,
            intermediate,
            double_wide_mlp: cfg.bool_or("use_double_wide_mlp", true)?,
            layers,
            heads,
            rms_norm_eps: cfg.f32_or("rms_norm_eps", 1e-6)?,
            vocab_size: usize_or("vocab_size", 262144)?,
            per_layer_hidden,
            vocab_size_per_layer: usize_or("vocab_size_per_layer_input", 262144)?,
            sliding_window,
            max_position_embeddings: usize_or("max_position_embeddings", 131072)?,
            final_logit_softcapping,
            rope_traditional: cfg.bool_or("rope_traditional", false)?,
            tie_word_embeddings: cfg.bool_or("tie_word_embeddings", true)?,
            moe,
            kinds,
            sliding,
            cached,
            kv_source,
        })
    }

    pub fn kind(&self, layer: usize) -> &Kind {
        &self.kinds[usize::from(self.sliding[layer])]
    }

    /// The dense MLP's width in `layer`: doubled on KV-shared layers with
    /// `use_double_wide_mlp` (mlx-lm's `MLP`).
    pub fn mlp_width(&self, layer: usize) -> usize {
        if self.double_wide_mlp && layer >= self.cached {
            2 * self.intermediate
        } else {
            self.intermediate
        }
    }

    /// One cache need per CACHED layer (shared layers hold none), each with
    /// its type's KV heads and head dim. `cfg` is the top-level config
    /// (dtype and quantization live there for `gemma4`).
    pub fn plan(&self, cfg: &Config) -> ModelPlan {
        let mut plan = model_kit::graph::attention_plan(
            cfg,
            &model_kit::graph::AttentionShape {
                sliding: &self.sliding[..self.cached],
                window: self.sliding_window,
                kv_heads: self.kinds[0].kv_heads,
                head_dim: self.kinds[0].head_dim,
                vocab_size: self.vocab_size,
                hidden: self.hidden,
                max_context: self.max_position_embeddings,
            },
        );
        for (i, need) in plan.layers.iter_mut().enumerate() {
            let k = self.kind(i);
            need.kv_heads = k.kv_heads as u32;
            need.k_head_dim = k.head_dim as u32;
            need.v_head_dim = k.head_dim as u32;
        }
        plan
    }
}

/// Per layer: sliding (true) or full attention, from `layer_types`, else
/// mlx-lm's pattern (`sliding_window_pattern - 1` sliding, then one full).
fn layer_types(cfg: &Config, layers: usize) -> Result<Vec<bool>> {
    let Some(types) = cfg.get("layer_types") else {
        let pattern = cfg.opt_usize("sliding_window_pattern")?.unwrap_or(5);
        return Ok((0..layers).map(|i| (i + 1) % pattern != 0).collect());
    };
    let types = types.as_array().ok_or_else(|| error("config.json: `layer_types` must be a list"))?;
    if types.len() < layers {
        return Err(error(format!("config.json: `layer_types` has {} entries for {layers} layers", types.len())));
    }
    types[..layers]
        .iter()
        .map(|t| match t.as_str() {
            Some("sliding_attention") => Ok(true),
            Some("full_attention") => Ok(false),
            _ => Err(error(format!("config.json: layer type {t} is not sliding_attention or full_attention"))),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: Value) -> Result<Args> {
        text_config(&Config(v)).and_then(|t| Args::from_config(&t))
    }

    /// mlx-lm's defaults (checked against `gemma4_text.ModelArgs()` and
    /// `Gemma4TextModel.previous_kvs`): 35 layers, 4 sliding then 1 full,
    /// the last 20 sharing layer 13 (sliding) or 14 (full).
    #[test]
    fn defaults_follow_mlx_lm() {
        let a = args(json!({"model_type": "gemma4_text"})).unwrap();
        assert_eq!(a.cached, 15);
        assert_eq!(&a.sliding[..6], &[true, true, true, true, false, true]);
        let shared: Vec<usize> = a.kv_source[15..].to_vec();
        assert_eq!(shared, [13, 13, 13, 13, 14, 13, 13, 13, 13, 14, 13, 13, 13, 13, 14, 13, 13, 13, 13, 14]);
        assert_eq!((a.kinds[0].head_dim, a.kinds[1].head_dim), (512, 256));
        assert_eq!(a.kinds[0].rope["rope_type"], "proportional");
        assert_eq!((a.kinds[0].rope_theta, a.kinds[1].rope_theta), (1_000_000.0, 10_000.0));
        assert_eq!((a.per_layer_hidden, a.final_logit_softcapping), (256, Some(30.0)));
        let plan = a.plan(&Config(json!({})));
        assert_eq!(plan.layers.len(), 15);
        assert_eq!(
            (plan.layers[4].kind, plan.layers[4].k_head_dim, plan.layers[4].window),
            (plugin_api::NeedKind::FULL, 512, 0)
        );
        assert_eq!(
            (plan.layers[0].kind, plan.layers[0].k_head_dim, plan.layers[0].window),
            (plugin_api::NeedKind::SLIDING, 256, 512)
        );
    }

    /// `null` is Python's None, not the dataclass default.
    #[test]
    fn null_means_none() {
        let a = args(json!({"model_type": "gemma4_text", "num_hidden_layers": 4, "global_head_dim": null,
            "final_logit_softcapping": null, "hidden_size_per_layer_input": null, "num_kv_shared_layers": null}))
        .unwrap();
        assert_eq!((a.kinds[0].head_dim, a.final_logit_softcapping, a.per_layer_hidden, a.cached), (256, None, 0, 4));
    }

    /// Global KV heads apply only with K = V; the plan carries each type's geometry.
    #[test]
    fn global_kv_heads_need_k_eq_v() {
        let base = json!({"model_type": "gemma4_text", "num_hidden_layers": 5, "num_kv_shared_layers": 0, "num_attention_heads": 4,
            "num_key_value_heads": 2, "num_global_key_value_heads": 1});
        assert_eq!(args(base.clone()).unwrap().kinds[0].kv_heads, 2);
        let mut keqv = base;
        keqv["attention_k_eq_v"] = json!(true);
        let a = args(keqv).unwrap();
        assert!(a.kinds[0].k_eq_v && !a.kinds[1].k_eq_v);
        let plan = a.plan(&Config(json!({})));
        assert_eq!(plan.layers.iter().map(|n| n.kv_heads).collect::<Vec<_>>(), [2, 2, 2, 2, 1]);
    }

    /// The multimodal wrapper: its `text_config`, with the top-level vocab.
    #[test]
    fn gemma4_wrapper_reads_text_config() {
        let a = args(json!({"model_type": "gemma4", "vocab_size": 1000, "text_config": {"num_hidden_layers": 5, "num_kv_shared_layers": 0}})).unwrap();
        assert_eq!((a.layers, a.vocab_size, a.heads), (5, 1000, 8));
    }

    #[test]
    fn refusals_name_the_problem() {
        let err = |v: Value| args(v).err().map(|e| e.what().to_owned()).unwrap_or_default();
        assert!(err(json!({"model_type": "gemma4_text", "num_hidden_layers": 4, "num_kv_shared_layers": 4}))
            .contains("num_kv_shared_layers"));
        assert!(err(json!({"model_type": "gemma4_text", "num_hidden_layers": 2, "num_kv_shared_layers": 1,
            "layer_types": ["sliding_attention", "full_attention"]}))
        .contains("layer 1 shares"));
        assert!(err(
            json!({"model_type": "gemma4_text", "num_hidden_layers": 1, "layer_types": ["chunked_attention"]})
        )
        .contains("chunked_attention"));
        assert!(err(json!({"model_type": "gemma4_text", "enable_moe_block": true, "num_experts": 4}))
            .contains("top_k_experts"));
        assert!(err(json!({"model_type": "gemma3_text"})).contains("not served"));
    }
}
