//! speculators' (vLLM's drafter library, 0.9.0) on-disk layout of DFlash
//! and DSpark drafters, read onto the same `Args` as mlx-vlm's layout.
//!
//! The config names its algorithm in `speculators_model_type` (`dflash`,
//! `dspark`), the draft layers' Hugging Face config in
//! `transformer_layer_config`, and the drafter's own fields at the top
//! level. The network and its tensor names are mlx-vlm's (`layers.*`,
//! `fc`, `hidden_norm`, `norm`, `markov_head.*`, `confidence_head.proj`);
//! where the two formats differ:
//! - taps: `aux_hidden_state_layer_ids` count the embedding output as
//!   layer 0 (speculators' DFlash converter adds one to mlx-vlm's
//!   `target_layer_ids`), so id `k` is the output of decoder layer `k − 1`;
//! - `block_size` is the block's slot count, anchor included: the drafts
//!   are its slots after the anchor, or every slot with
//!   `sample_from_anchor` (DSpark's default, DFlash's is off), so the verify
//!   width is `block_size + sample_from_anchor`; no runtime cap applies;
//! - DSpark's confidence head is on unless disabled, and `markov_rank` 0
//!   means no Markov head;
//! - the embedding and LM head are the verifier's and are not saved (a
//!   checkpoint that carries copies has them dropped, `verifier_owned`);
//! - a `draft_vocab_size` below the verifier's is a reduced draft
//!   vocabulary with its `t2d` / `d2t` maps and maybe an `lm_head` of its
//!   own (`draft_vocab`).
//!
//! Refused by name: a `draft_vocab_size` above the verifier's, a
//! `target_hidden_size` other than the draft's, the embedding output as a
//! tap, biased projections, sliding draft layers.

use crate::config::{Args, Layout, MarkovKind};
use model_kit::{error, Result};
use serde_json::{json, Map, Value};

/// Tensors speculators keeps for training or fills from the verifier: the
/// verifier's embedding, LM head and final norm, and identity vocabulary
/// maps. None is a drafter weight here, except, for a drafter with a
/// `reduced` vocabulary, its maps and its own LM head.
pub fn verifier_owned(name: &str, reduced: bool) -> bool {
    match name {
        "embed_tokens.weight" | "verifier_lm_head.weight" | "verifier_norm.weight" => true,
        "lm_head.weight" | "d2t" | "t2d" => !reduced,
        _ => false,
    }
}

/// Whether a config.json is in speculators' layout.
pub fn declared(text: &str) -> bool {
    serde_json::from_str::<Value>(text).is_ok_and(|v| v.get("speculators_model_type").is_some())
}

fn int(v: &Map<String, Value>, key: &str, what: &str) -> Result<Option<u64>> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => x.as_u64().map(Some).ok_or_else(|| error(format!("{what}`{key}` must be a non-negative integer"))),
    }
}

fn flag(v: &Map<String, Value>, key: &str, default: bool) -> Result<bool> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(x) => Err(error(format!("speculators config: `{key}` must be a boolean, got {x}"))),
    }
}

/// The hyper-parameters of a speculators DFlash or DSpark config.
pub fn args(text: &str) -> Result<Args> {
    let top: Map<String, Value> = serde_json::from_str(text).map_err(|e| error(format!("config.json: {e}")))?;
    let kind = top.get("speculators_model_type").and_then(Value::as_str).unwrap_or("?");
    let dspark = match kind {
        "dflash" => false,
        "dspark" => true,
        other => {
            return Err(error(format!(
                "speculators_model_type `{other}` is not built by the block drafters (dflash and dspark are; mtp is draft-mtp's)"
            )))
        }
    };
    let Some(Value::Object(layer)) = top.get("transformer_layer_config") else {
        return Err(error("speculators config: a `transformer_layer_config` object is required"));
    };
    let tl = "transformer_layer_config.";
    let hidden =
        int(layer, "hidden_size", tl)?.ok_or_else(|| error("transformer_layer_config.hidden_size is required"))?;
    let vocab =
        int(layer, "vocab_size", tl)?.ok_or_else(|| error("transformer_layer_config.vocab_size is required"))?;
    // speculators' default when the key is absent.
    let draft_vocab = int(&top, "draft_vocab_size", "")?.unwrap_or(32000);
    if draft_vocab == 0 || draft_vocab > vocab {
        return Err(error(format!(
            "draft_vocab_size {draft_vocab} must be between 1 and the verifier's vocabulary {vocab}"
        )));
    }
    if let Some(t) = int(&top, "target_hidden_size", "")?.filter(|t| *t != hidden) {
        return Err(error(format!(
            "target_hidden_size {t} differs from the draft's hidden_size {hidden}: a projection between them is not built"
        )));
    }
    if flag(layer, "attention_bias", false)? {
        return Err(error("transformer_layer_config.attention_bias (biased projections) is not built"));
    }
    if let Some(Value::Array(types)) = layer.get("layer_types") {
        if types.iter().any(|t| t == "sliding_attention") {
            return Err(error("transformer_layer_config.layer_types: sliding_attention draft layers are not built"));
        }
    }
    let Some(Value::Array(aux)) = top.get("aux_hidden_state_layer_ids") else {
        return Err(error("aux_hidden_state_layer_ids is required"));
    };
    let mut taps = Vec::with_capacity(aux.len());
    for id in aux {
        match id.as_u64() {
            Some(0) => return Err(error("aux_hidden_state_layer_ids: 0 (the embedding output) is not built as a tap")),
            Some(k) => taps.push(k - 1),
            None => return Err(error(format!("aux_hidden_state_layer_ids must be layer ids, got {id}"))),
        }
    }
    let sample_from_anchor = flag(&top, "sample_from_anchor", dspark)?;
    let block = int(&top, "block_size", "")?.unwrap_or(8) as usize;
    let width = block + usize::from(sample_from_anchor);
    if width < 2 {
        return Err(error(format!("block_size {block} leaves no proposals")));
    }

    // mlx-vlm's layout of the same network: the layer config at the top,
    // a plain DFlash `dflash_config`; the fields that differ are set after.
    let mut cfg = layer.clone();
    for key in ["layer_types", "block_size", "mask_token_id", "dflash_config", "sliding_window"] {
        cfg.remove(key);
    }
    let mut dflash = json!({"target_layer_ids": taps, "block_size": width});
    if let Some(m) = top.get("mask_token_id").filter(|m| !m.is_null()) {
        dflash["mask_token_id"] = m.clone();
    }
    cfg.insert("dflash_config".into(), dflash);
    let mut a = Args::from_config(&Value::Object(cfg).to_string(), Layout::DFlash)?;
    a.width = width;
    a.sample_from_anchor = sample_from_anchor;
    a.draft_vocab = (draft_vocab < vocab).then_some(draft_vocab as usize);
    a.causal = false;
    (a.markov, a.confidence) = (None, None);
    if dspark {
        let rank = int(&top, "markov_rank", "")?.unwrap_or(256) as usize;
        let kind = MarkovKind::parse(top.get("markov_head_type").and_then(Value::as_str))?;
        a.markov = (rank > 0).then_some((kind, rank));
        if flag(&top, "enable_confidence_head", true)? {
            let with_markov = flag(&top, "confidence_head_with_markov", true)?;
            if with_markov && rank == 0 {
                return Err(error("confidence_head_with_markov needs a Markov head (markov_rank is 0)"));
            }
            a.confidence = Some(with_markov);
        }
    }
    Ok(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra: &str) -> String {
        format!(
            r#"{{"speculators_model_type": "dspark", "draft_vocab_size": 96, "mask_token_id": 95,
            "aux_hidden_state_layer_ids": [2, 4], "block_size": 3, "markov_rank": 8,
            "transformer_layer_config": {{"model_type": "qwen3", "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
            "vocab_size": 96, "layer_types": ["full_attention", "full_attention"]}}{extra}}}"#
        )
    }

    #[test]
    fn dspark_and_dflash_map_onto_the_reference_fields() {
        let a = args(&config("")).unwrap();
        assert_eq!((a.width, a.sample_from_anchor, a.target_layer_ids.clone()), (4, true, vec![1, 3]));
        assert_eq!((a.markov, a.confidence, a.mask_token_id), (Some((MarkovKind::Vanilla, 8)), Some(true), 95));
        let a = args(&config(r#", "speculators_model_type": "dflash", "block_size": 4"#)).unwrap();
        assert_eq!((a.width, a.sample_from_anchor, a.markov, a.confidence), (4, false, None, None));
        let a = args(&config(r#", "markov_rank": 0, "confidence_head_with_markov": false"#)).unwrap();
        assert_eq!((a.markov, a.confidence), (None, Some(false)));
        assert_eq!(args(&config("")).unwrap().draft_vocab, None);
        assert_eq!(args(&config(r#", "draft_vocab_size": 32"#)).unwrap().draft_vocab, Some(32));
    }

    #[test]
    fn what_is_not_built_is_refused_by_key() {
        let bad = |extra: &str| args(&config(extra)).expect_err(extra).what().to_owned();
        assert!(bad(r#", "draft_vocab_size": 97"#).contains("draft_vocab_size 97 must be between 1 and"));
        assert!(bad(r#", "target_hidden_size": 128"#).contains("target_hidden_size 128"));
        assert!(bad(r#", "aux_hidden_state_layer_ids": [0, 2]"#).contains("aux_hidden_state_layer_ids: 0"));
        assert!(bad(r#", "speculators_model_type": "eagle3""#).contains("speculators_model_type `eagle3`"));
        assert!(bad(r#", "markov_head_type": "lstm""#).contains("markov_head_type `lstm`"));
    }
}
