//! A block drafter's hyper-parameters, read as mlx-vlm 0.7.10 reads them,
//! from one of two on-disk layouts (`Layout`):
//! - `DFlash`: a Qwen3-shaped backbone config with a `dflash_config`
//!   object. Two variants share the network:
//!   - DFlash (`qwen3_dflash`): the block is `[anchor, mask × (W−1)]` for a
//!     verify width `W` (`block_size`, capped by `runtime_block_size`), the
//!     drafts are the outputs of slots 1.., no Markov head;
//!   - DSpark (`dflash_config.projector_type == "dspark"` or a
//!     `markov_rank`): the checkpoint's `block_size` counts proposals (one
//!     more for the anchor unless `dspark_bonus_anchor`),
//!     `runtime_block_size` defaults to 8, with `sample_from_anchor` every
//!     slot's output (the anchor's included) is a draft, and a Markov head
//!     corrects each draft's logits by the token before it (speculators'
//!     `markov_head_type`: vanilla, gated or rnn).
//! - `DeepSpec`: the `Gemma4DSparkModel` release (mlx-vlm's
//!   `gemma4_dspark`): a DSpark over Gemma 4 layers (sandwich norms, a
//!   layer scalar, GeGLU, keys and values from one projection on
//!   `attention_k_eq_v` layers at `global_head_dim`, unit attention scale),
//!   its own embedding (scaled by √H) and LM head, logits soft-capped (30
//!   unless the config says otherwise); the DSpark fields sit flat or under
//!   `dflash_config`, `block_size` counts proposals.
//!
//! A `DFlash` folder may also be in speculators' layout (a
//! `speculators_model_type` in config.json), mapped onto the same fields by
//! `speculators.rs`.
//!
//! Only the fixed block policy is built: the width never adapts to
//! acceptance, so rounds are reproducible (mlx-vlm's `adaptive` policy is
//! not followed; a config asking for it drafts at the fixed width). DSpark
//! drafters with a sliding window cap the width by the prompt's length as
//! mlx-vlm's `choose_block_ceiling` does (`Args::ceiling`).

use model_kit::config::Config;
use model_kit::{error, Result};
use serde_json::Value;

/// Which on-disk layout a folder is read as (its plugin decides).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Layout {
    DFlash,
    DeepSpec,
}

/// The decoder layers' shape.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Backbone {
    /// Pre-norm attention and SwiGLU MLP (Qwen3).
    Qwen3,
    /// Gemma 4: each sub-block between two norms, GeGLU, the layer scalar.
    Gemma4,
}

/// The Markov head kinds speculators defines (`markov_head_type`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MarkovKind {
    Vanilla,
    Gated,
    Rnn,
}

impl MarkovKind {
    pub(crate) fn parse(name: Option<&str>) -> Result<Self> {
        match name.unwrap_or("vanilla") {
            "vanilla" => Ok(Self::Vanilla),
            "gated" => Ok(Self::Gated),
            "rnn" => Ok(Self::Rnn),
            other => Err(error(format!("markov_head_type `{other}` is not built (vanilla, gated and rnn are)"))),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Args {
    pub backbone: Backbone,
    pub hidden: usize,
    pub intermediate: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Values are the keys' projection before its norm (no `v_proj`).
    pub k_eq_v: bool,
    pub attention_scale: f32,
    pub eps: f32,
    pub rope_theta: f32,
    pub rope_traditional: bool,
    pub rope_scaling: Option<Value>,
    pub vocab_size: usize,
    /// Verify width: the anchor plus the proposals of one round.
    pub width: usize,
    pub mask_token_id: u32,
    /// Target decoder layers whose outputs feed the context, ascending.
    pub target_layer_ids: Vec<u32>,
    /// The target's decoder layer count the drafter was trained for.
    pub num_target_layers: Option<usize>,
    pub causal: bool,
    pub sample_from_anchor: bool,
    pub final_logit_softcapping: Option<f32>,
    /// `(kind, rank)` of the DSpark Markov head.
    pub markov: Option<(MarkovKind, usize)>,
    /// A confidence head `[1, H (+ rank)]`; `true` = its input includes the
    /// Markov embedding of the previous token.
    pub confidence: Option<bool>,
    /// The drafter's own `embed_tokens` (times this scale) and `lm_head`
    /// instead of the target's.
    pub own_vocab: Option<f32>,
    /// DSpark's `sliding_window`: the width ceiling by prompt length.
    pub window: Option<usize>,
    /// speculators' reduced draft vocabulary: its size (`draft_vocab`).
    pub draft_vocab: Option<usize>,
}

impl Args {
    /// The proposals of one round.
    pub fn proposals(&self) -> usize {
        self.width - 1
    }

    /// The verify width for a prompt of `context` tokens ([`ceiling`]).
    pub fn ceiling(&self, context: usize) -> usize {
        ceiling(self.width, self.window, context)
    }

    /// The arguments of a config.json in the layout's own format (one in
    /// speculators' format is mapped onto it by `speculators::args` first).
    pub fn from_config(text: &str, layout: Layout) -> Result<Self> {
        match layout {
            Layout::DFlash => Self::from_dflash(text),
            Layout::DeepSpec => Self::from_deepspec(text),
        }
    }

    fn from_dflash(text: &str) -> Result<Self> {
        let cfg = Config::parse(text)?;
        let Some(Value::Object(d)) = cfg.get("dflash_config") else {
            return Err(error("config.json: a block drafter needs a `dflash_config` object"));
        };
        let dflash = Config(Value::Object(d.clone()));
        let dspark = dflash.str("projector_type") == Some("dspark") || dflash.opt_usize("markov_rank")?.is_some();
        if let Some(p) = dflash.str("projector_type").filter(|p| *p != "dspark") {
            return Err(error(format!("dflash_config.projector_type `{p}` is not built (only `dspark`)")));
        }
        let or = |k: &str, d: usize| -> Result<usize> { Ok(cfg.opt_usize(k)?.unwrap_or(d)) };
        let hidden = cfg.usize("hidden_size")?;
        let layers = cfg.usize("num_hidden_layers")?;
        let heads = cfg.usize("num_attention_heads")?;
        let kv_heads = cfg.usize("num_key_value_heads")?;
        if !heads.is_multiple_of(kv_heads) {
            return Err(error(format!(
                "num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}"
            )));
        }
        if let Some(act) = cfg.str("hidden_act").filter(|a| *a != "silu") {
            return Err(error(format!("hidden_act `{act}` is not built (only silu)")));
        }
        if let Some(t) = layer_types(&cfg).iter().find(|t| *t != "full_attention") {
            return Err(error(format!("draft layer type `{t}` is not built (full attention layers only)")));
        }
        if dflash.opt_usize("draft_window_size")?.is_some() {
            return Err(error("dflash_config.draft_window_size (a windowed context cache) is not built"));
        }
        let (rope_theta, rope_scaling) = match cfg.get("rope_parameters") {
            Some(Value::Object(p)) => {
                let mut p = p.clone();
                let theta = p.remove("rope_theta").and_then(|t| t.as_f64()).unwrap_or(1e7);
                (theta as f32, Some(Value::Object(p)))
            }
            _ => (cfg.f32_or("rope_theta", 1e7)?, cfg.get("rope_scaling").cloned()),
        };
        let vocab_size = cfg.usize("vocab_size")?;
        let mask_token_id = non_negative(&dflash, "mask_token_id")?
            .or(non_negative(&cfg, "mask_token_id")?)
            .ok_or_else(|| error("dflash_config.mask_token_id is required"))?;
        if mask_token_id >= vocab_size {
            return Err(error(format!("mask_token_id {mask_token_id} is outside the vocabulary ({vocab_size})")));
        }
        let target_layer_ids = layer_ids(&dflash)?;
        let raw_block = dflash.opt_usize("block_size")?.or(cfg.opt_usize("block_size")?);
        let runtime = dflash.opt_usize("runtime_block_size")?;
        let width = if dspark {
            let raw = raw_block.ok_or_else(|| error("a DSpark config needs a block_size"))?;
            let full = raw + usize::from(!cfg.bool_or("dspark_bonus_anchor", false)?);
            full.min(runtime.unwrap_or(8))
        } else {
            let full = raw_block.unwrap_or(16);
            runtime.map_or(full, |r| full.min(r))
        };
        if width < 2 {
            return Err(error(format!("a verify width of {width} leaves no proposals")));
        }
        let markov = if dspark {
            let rank = dflash.opt_usize("markov_rank")?.unwrap_or(256);
            Some((MarkovKind::parse(dflash.str("markov_head_type"))?, rank))
        } else {
            None
        };
        let confidence = (dspark && dflash.bool_or("enable_confidence_head", false)?)
            .then(|| dflash.bool_or("confidence_head_with_markov", true))
            .transpose()?;
        let causal = match dflash.get("causal") {
            Some(_) => dflash.bool_or("causal", false)?,
            None => cfg.bool_or("dflash_query_causal", false)?,
        };
        if dflash.bool_or("attention_sink_bias", false)? {
            return Err(error("dflash_config.attention_sink_bias is not built"));
        }
        let head_dim = or("head_dim", hidden / heads)?;
        let window = match dspark {
            true => dflash.opt_usize("swa_window_size")?.or(cfg.opt_usize("sliding_window")?),
            false => None,
        };
        Ok(Self {
            backbone: Backbone::Qwen3,
            hidden,
            intermediate: cfg.usize("intermediate_size")?,
            layers,
            heads,
            kv_heads,
            head_dim,
            k_eq_v: false,
            attention_scale: (head_dim as f64).powf(-0.5) as f32,
            eps: cfg.f32_or("rms_norm_eps", 1e-6)?,
            rope_theta,
            rope_traditional: !cfg.bool_or("rope_is_neox_style", true)?,
            rope_scaling,
            vocab_size,
            width,
            mask_token_id: mask_token_id as u32,
            target_layer_ids,
            num_target_layers: dflash.opt_usize("num_target_layers")?,
            causal,
            sample_from_anchor: dspark && dflash.bool_or("sample_from_anchor", true)?,
            final_logit_softcapping: cfg.get("final_logit_softcapping").and_then(Value::as_f64).map(|v| v as f32),
            markov,
            confidence,
            own_vocab: None,
            draft_vocab: None,
            window,
        })
    }

    /// mlx-vlm's `Gemma4DsparkConfig.from_dict`: the DSpark fields from
    /// `dflash_config` when present, else flat; every draft layer a
    /// full-attention one.
    fn from_deepspec(text: &str) -> Result<Self> {
        let cfg = Config::parse(text)?;
        let source = match cfg.get("dflash_config") {
            Some(Value::Object(d)) => Config(Value::Object(d.clone())),
            _ => Config(cfg.0.clone()),
        };
        let hidden = cfg.usize("hidden_size")?;
        let layers = cfg.usize("num_hidden_layers")?;
        let heads = cfg.usize("num_attention_heads")?;
        let k_eq_v = cfg.bool_or("attention_k_eq_v", true)?;
        let local_dim = cfg.opt_usize("head_dim")?.unwrap_or(256);
        // A key set to null is not an absent one: the reference's defaults
        // apply only to absent keys (`Config::get` reads null as absent).
        let raw = |k: &str| cfg.0.get(k);
        let head_dim = match raw("global_head_dim") {
            None => 512,
            Some(Value::Null) => local_dim,
            Some(_) => match cfg.usize("global_head_dim")? {
                0 => local_dim,
                g => g,
            },
        };
        let kv_heads = match (k_eq_v, raw("num_global_key_value_heads")) {
            (true, None) => 1,
            (true, Some(v)) if !v.is_null() => cfg.usize("num_global_key_value_heads")?,
            _ => cfg.opt_usize("num_key_value_heads")?.unwrap_or(8),
        };
        if kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
            return Err(error(format!("num_attention_heads {heads} is not a multiple of {kv_heads} key/value heads")));
        }
        if let Some(t) = layer_types(&cfg).iter().find(|t| *t != "full_attention") {
            return Err(error(format!("draft layer type `{t}` is not built (full attention layers only)")));
        }
        for (key, what) in [
            ("enable_moe_block", "an expert block"),
            ("attention_sink_bias", "attention sinks"),
            ("use_double_wide_mlp", "double-wide MLPs"),
        ] {
            if cfg.bool_or(key, false)? {
                return Err(error(format!("`{key}` ({what}) is not built in DeepSpec drafters")));
            }
        }
        if cfg.opt_usize("num_kv_shared_layers")?.unwrap_or(0) > 0 {
            return Err(error("`num_kv_shared_layers` is not built in DeepSpec drafters"));
        }
        if source.opt_usize("draft_window_size")?.is_some() {
            return Err(error("draft_window_size (a windowed context cache) is not built"));
        }
        let rope = match cfg.get("rope_parameters") {
            None => Value::Object(Default::default()),
            Some(Value::Object(p)) => p.get("full_attention").cloned().unwrap_or(Value::Object(Default::default())),
            Some(v) => return Err(error(format!("config.json: `rope_parameters` must be an object, got {v}"))),
        };
        let rope_theta = rope.get("rope_theta").and_then(Value::as_f64).unwrap_or(10000.0) as f32;
        let vocab_size = cfg.usize("vocab_size")?;
        let mask_token_id =
            non_negative(&source, "mask_token_id")?.ok_or_else(|| error("DeepSpec: mask_token_id is required"))?;
        if mask_token_id >= vocab_size {
            return Err(error(format!("mask_token_id {mask_token_id} is outside the vocabulary ({vocab_size})")));
        }
        let proposals = source
            .opt_usize("block_size")?
            .or(cfg.opt_usize("block_size")?)
            .ok_or_else(|| error("DeepSpec: a checkpoint block_size is required"))?;
        let full = proposals + 1;
        let width = source.opt_usize("runtime_block_size")?.unwrap_or(full.min(8)).min(full);
        if width < 2 {
            return Err(error(format!("a verify width of {width} leaves no proposals")));
        }
        let rank = source.opt_usize("markov_rank")?.unwrap_or(256);
        let markov_kind = MarkovKind::parse(source.str("markov_head_type"))?;
        let confidence = source
            .bool_or("enable_confidence_head", false)?
            .then(|| source.bool_or("confidence_head_with_markov", true))
            .transpose()?;
        let final_logit_softcapping = match raw("final_logit_softcapping") {
            None => Some(30.0),
            Some(v) => v.as_f64().map(|v| v as f32),
        };
        Ok(Self {
            backbone: Backbone::Gemma4,
            hidden,
            intermediate: cfg.usize("intermediate_size")?,
            layers,
            heads,
            kv_heads,
            head_dim,
            k_eq_v,
            attention_scale: 1.0,
            eps: cfg.f32_or("rms_norm_eps", 1e-6)?,
            rope_theta,
            rope_traditional: cfg.bool_or("rope_traditional", false)?,
            rope_scaling: Some(rope),
            vocab_size,
            width,
            mask_token_id: mask_token_id as u32,
            target_layer_ids: layer_ids(&source)?,
            num_target_layers: source.opt_usize("num_target_layers")?,
            causal: cfg.bool_or("is_causal", false)?,
            sample_from_anchor: cfg.bool_or("sample_from_anchor", true)?,
            final_logit_softcapping,
            markov: Some((markov_kind, rank)),
            confidence,
            own_vocab: Some((hidden as f32).sqrt()),
            draft_vocab: None,
            window: match raw("sliding_window") {
                None => Some(1024),
                Some(Value::Null) => None,
                Some(_) => cfg.opt_usize("sliding_window")?,
            },
        })
    }
}

/// The verify width mlx-vlm's `choose_block_ceiling` allows a DSpark
/// drafter of `width` with a sliding `window` for a prompt of `context`
/// tokens: at most 6 within the window, 4 past it.
pub fn ceiling(width: usize, window: Option<usize>, context: usize) -> usize {
    match window {
        Some(w) if context <= w => width.min(6),
        Some(_) => width.min(4),
        None => width,
    }
}

fn layer_types(cfg: &Config) -> Vec<String> {
    match cfg.get("layer_types") {
        Some(Value::Array(t)) => t.iter().map(|x| x.as_str().unwrap_or("?").to_owned()).collect(),
        _ => Vec::new(),
    }
}

fn non_negative(cfg: &Config, key: &str) -> Result<Option<usize>> {
    match cfg.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .map(|n| Some(n as usize))
            .ok_or_else(|| error(format!("config.json: `{key}` must be a non-negative integer, got {v}"))),
    }
}

/// `target_layer_ids`, strictly increasing (the order the context
/// concatenates them in is the target's layer order).
fn layer_ids(dflash: &Config) -> Result<Vec<u32>> {
    let Some(Value::Array(ids)) = dflash.get("target_layer_ids") else {
        return Err(error("target_layer_ids is required"));
    };
    let ids: Vec<u32> = ids
        .iter()
        .map(|v| v.as_u64().filter(|n| *n < 1 << 20).map(|n| n as u32))
        .collect::<Option<_>>()
        .ok_or_else(|| error("target_layer_ids must be layer indices"))?;
    if ids.is_empty() || ids.windows(2).any(|w| w[0] >= w[1]) {
        return Err(error(format!("target_layer_ids {ids:?} must be non-empty and increasing")));
    }
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#""hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 96"#;

    fn args(extra: &str) -> Result<Args> {
        Args::from_config(&format!("{{{BASE}, {extra}}}"), Layout::DFlash)
    }

    #[test]
    fn dflash_and_dspark_widths_follow_the_reference() {
        let a = args(r#""block_size": 4, "dflash_config": {"mask_token_id": 0, "target_layer_ids": [1, 3]}"#).unwrap();
        assert_eq!((a.width, a.proposals(), a.sample_from_anchor, a.markov), (4, 3, false, None));
        let a = args(
            r#""dflash_config": {"projector_type": "dspark", "block_size": 3, "markov_rank": 8,
            "mask_token_id": 95, "target_layer_ids": [0, 2]}"#,
        )
        .unwrap();
        assert_eq!((a.width, a.sample_from_anchor, a.markov), (4, true, Some((MarkovKind::Vanilla, 8))));
        let a = args(
            r#""dspark_bonus_anchor": true, "dflash_config": {"block_size": 12, "markov_rank": 8,
            "mask_token_id": 5, "target_layer_ids": [0]}"#,
        )
        .unwrap();
        assert_eq!(a.width, 8, "runtime_block_size defaults to 8 for DSpark");
    }

    #[test]
    fn unbuilt_variants_and_bad_values_are_refused_by_name() {
        let bad = |extra: &str| args(extra).expect_err(extra).what().to_owned();
        let e = bad(r#""dflash_config": {"markov_rank": 8, "markov_head_type": "lstm", "block_size": 3,
            "mask_token_id": 1, "target_layer_ids": [0]}"#);
        assert!(e.contains("markov_head_type `lstm` is not built"), "{e}");
        let e = bad(r#""dflash_config": {"mask_token_id": 96, "target_layer_ids": [0]}"#);
        assert!(e.contains("mask_token_id 96 is outside the vocabulary (96)"), "{e}");
        let e = bad(r#""dflash_config": {"mask_token_id": 1, "target_layer_ids": [2, 1]}"#);
        assert!(e.contains("must be non-empty and increasing"), "{e}");
        let e = bad(r#""layer_types": ["sliding_attention", "full_attention"], "dflash_config": {"mask_token_id": 1,
            "target_layer_ids": [0]}"#);
        assert!(e.contains("`sliding_attention` is not built"), "{e}");
        let e = bad(r#""num_key_value_heads": 3"#);
        assert!(e.contains("dflash_config"), "{e}");
    }

    #[test]
    fn deepspec_reads_the_flat_release_layout_as_the_reference() {
        let a = Args::from_config(
            r#"{"architectures": ["Gemma4DSparkModel"], "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "head_dim": 16, "global_head_dim": 32,
            "vocab_size": 96, "block_size": 7, "mask_token_id": 95, "target_layer_ids": [1, 3]}"#,
            Layout::DeepSpec,
        )
        .unwrap();
        // k_eq_v and one global KV head by default; the block counts
        // proposals; softcap 30 and a window of 1024 unless said.
        assert_eq!(
            (a.backbone, a.k_eq_v, a.kv_heads, a.head_dim, a.attention_scale),
            (Backbone::Gemma4, true, 1, 32, 1.0)
        );
        assert_eq!((a.width, a.final_logit_softcapping, a.own_vocab, a.window), (8, Some(30.0), Some(8.0), Some(1024)));
        assert_eq!(a.markov, Some((MarkovKind::Vanilla, 256)));
        // mlx-vlm's choose_block_ceiling: 6 within the window, 4 past it.
        assert_eq!((a.ceiling(1024), a.ceiling(1025)), (6, 4));
        // Null is not absent: no window, no cap.
        let text = r#"{"architectures": ["Gemma4DSparkModel"], "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 96, "block_size": 7,
            "mask_token_id": 95, "target_layer_ids": [1], "sliding_window": null, "global_head_dim": null,
            "final_logit_softcapping": null}"#;
        let a = Args::from_config(text, Layout::DeepSpec).unwrap();
        assert_eq!((a.window, a.ceiling(1), a.head_dim, a.final_logit_softcapping), (None, 8, 256, None));
        let e =
            Args::from_config(r#"{"hidden_size": 64}"#, Layout::DeepSpec).expect_err("incomplete").what().to_owned();
        assert!(e.contains("num_hidden_layers"), "{e}");
    }
}
