//! Which draft kind a draft artifact is, in the ancestor's order (kept for
//! compatibility): `dspark.json` → dspark; `architectures[0] ==
//! "Gemma4DSparkModel"` → deepspec; `model_type` contains "assistant" →
//! assistant; `model_type` ends with "_mtp" → mtp; otherwise two-model.
//! `ngram` is never detected: it is only ever asked for, and never with a
//! draft model.

use serde_json::Value;
use std::path::Path;

pub fn detect(dir: &Path) -> String {
    if dir.join("dspark.json").exists() {
        return "dspark".into();
    }
    let config: Value = std::fs::read_to_string(dir.join("config.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null);
    let arch0 = config.get("architectures").and_then(|a| a.get(0)).and_then(Value::as_str).unwrap_or("");
    let model_type = config.get("model_type").and_then(Value::as_str).unwrap_or("");
    if arch0 == "Gemma4DSparkModel" {
        "deepspec".into()
    } else if model_type.contains("assistant") {
        "assistant".into()
    } else if model_type.ends_with("_mtp") {
        "mtp".into()
    } else {
        "two-model".into()
    }
}

#[cfg(test)]
mod tests {
    use super::detect;

    fn folder(config: &str, dspark: bool) -> tempdir::Dir {
        let d = tempdir::Dir::new();
        std::fs::write(d.0.join("config.json"), config).unwrap();
        if dspark {
            std::fs::write(d.0.join("dspark.json"), "{}").unwrap();
        }
        d
    }

    mod tempdir {
        pub struct Dir(pub std::path::PathBuf);
        impl Dir {
            pub fn new() -> Self {
                use std::sync::atomic::{AtomicUsize, Ordering};
                static N: AtomicUsize = AtomicUsize::new(0);
                let p = std::env::temp_dir().join(format!(
                    "draftkind-{}-{}",
                    std::process::id(),
                    N.fetch_add(1, Ordering::SeqCst)
                ));
                std::fs::create_dir_all(&p).unwrap();
                Dir(p)
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    #[test]
    fn detection_follows_the_ancestors_order() {
        // dspark.json wins over everything else in the folder.
        assert_eq!(
            detect(&folder(r#"{"model_type":"qwen3_5_mtp","architectures":["Gemma4DSparkModel"]}"#, true).0),
            "dspark"
        );
        assert_eq!(
            detect(&folder(r#"{"model_type":"gemma4_assistant","architectures":["Gemma4DSparkModel"]}"#, false).0),
            "deepspec"
        );
        assert_eq!(detect(&folder(r#"{"model_type":"gemma4_assistant"}"#, false).0), "assistant");
        assert_eq!(detect(&folder(r#"{"model_type":"qwen3_5_mtp"}"#, false).0), "mtp");
        assert_eq!(detect(&folder(r#"{"model_type":"llama"}"#, false).0), "two-model");
        // "mtp" must be a suffix: a model type that merely contains it is a full model.
        assert_eq!(detect(&folder(r#"{"model_type":"mtp_llama"}"#, false).0), "two-model");
    }
}
