//! speculators' (vLLM's drafter library, 0.9.0) on-disk layout of an MTP
//! head: config.json with `speculators_model_type: "mtp"`, the verifier's
//! text config as `transformer_layer_config`, `num_nextn_predict_layers`
//! (speculators builds only 1), and the head's tensors as speculators'
//! MTP converter renames a checkpoint's `mtp.*`: `fc` → `input_proj`,
//! `pre_fc_norm_embedding` → `token_layernorm`, `pre_fc_norm_hidden` →
//! `hidden_layernorm`, `norm` → `final_layernorm`, the decoder layer's
//! own under the same `mtp_layers.0.`; values copied as they were, so the
//! Qwen3.5 norms stay stored minus one. The embedding and LM head are the
//! verifier's (not saved), as here.
//!
//! Only Qwen3.5's gated-attention layers are built (`qwen3_5_text`);
//! speculators' Qwen3 (plain attention) and MoE heads are refused by name.

use model_kit::{error, Result};
use serde_json::{json, Value};

/// The head's config in the `qwen3_5_mtp` layout `head::Args` reads, from
/// a speculators MTP config.
pub fn config(config: &str) -> Result<String> {
    let v: Value = serde_json::from_str(config).map_err(|e| error(format!("config.json: {e}")))?;
    let kind = &v["speculators_model_type"];
    if kind != "mtp" {
        return Err(error(format!("speculators_model_type {kind} is not an MTP head")));
    }
    let Some(Value::Object(layer)) = v.get("transformer_layer_config") else {
        return Err(error("speculators config: a `transformer_layer_config` object is required"));
    };
    match layer.get("model_type").and_then(Value::as_str) {
        Some("qwen3_5_text" | "qwen3_5") => {}
        other => {
            return Err(error(format!(
                "transformer_layer_config.model_type {} is not built (only qwen3_5_text: Qwen3.5's gated attention)",
                other.map_or("(none)".into(), |m| format!("`{m}`"))
            )))
        }
    }
    let layers = v.get("num_nextn_predict_layers").map_or(Some(1), Value::as_u64);
    if layers != Some(1) {
        return Err(error(format!(
            "num_nextn_predict_layers {} is not built (one MTP layer, as speculators builds)",
            v["num_nextn_predict_layers"]
        )));
    }
    // The text config's `num_hidden_layers` is the verifier's: the head's
    // own layer count is this one.
    let mut text = layer.clone();
    text.insert("mtp_num_hidden_layers".into(), json!(1));
    Ok(json!({"model_type": "qwen3_5_mtp", "text_config": text}).to_string())
}

/// The stored name of the head's tensor `name` in the `qwen3_5_mtp`
/// layout (`fc`, `layers.0.self_attn`, ...).
pub fn tensor(name: &str) -> String {
    let renamed = match name {
        "fc" => "input_proj",
        "pre_fc_norm_embedding" => "token_layernorm",
        "pre_fc_norm_hidden" => "hidden_layernorm",
        "norm" => "final_layernorm",
        other => other.strip_prefix("layers.0.").unwrap_or(other),
    };
    format!("mtp_layers.0.{renamed}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_configs_map_as_speculators_converter_writes_them() {
        assert_eq!(tensor("fc"), "mtp_layers.0.input_proj");
        assert_eq!(tensor("layers.0.self_attn"), "mtp_layers.0.self_attn");
        assert_eq!(tensor("norm"), "mtp_layers.0.final_layernorm");
        let ok = r#"{"speculators_model_type": "mtp", "num_nextn_predict_layers": 1,
            "transformer_layer_config": {"model_type": "qwen3_5_text", "hidden_size": 64, "num_hidden_layers": 4}}"#;
        let text: Value = serde_json::from_str(&config(ok).unwrap()).unwrap();
        assert_eq!(text["text_config"]["mtp_num_hidden_layers"], 1);
        let e = config(&ok.replace("qwen3_5_text", "qwen3")).unwrap_err();
        assert!(e.what().contains("model_type `qwen3` is not built"), "{}", e.what());
        let e = config(&ok.replace("\"num_nextn_predict_layers\": 1", "\"num_nextn_predict_layers\": 2"));
        assert!(e.unwrap_err().what().contains("num_nextn_predict_layers 2"));
    }
}
