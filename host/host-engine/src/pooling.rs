//! How an embedding folder turns final hidden states into one vector per
//! input, read the way sentence-transformers reads it: `modules.json` lists
//! the pipeline (Transformer → Pooling → optional Normalize), and the
//! Pooling module's `config.json` sets one `pooling_mode_*` flag. A folder
//! without a Pooling module (a chat model) serves no embeddings.

use serde_json::Value;
use std::path::Path;

/// Which positions' hidden states make an input's vector.
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolingMode {
    /// The first position (BERT's [CLS]).
    Cls,
    /// The average over every position.
    Mean,
    /// The last position (decoder embedders such as Qwen3-Embedding: the
    /// only position that has attended to the whole input).
    LastToken,
}

impl PoolingMode {
    pub fn name(self) -> &'static str {
        match self {
            Self::Cls => "cls",
            Self::Mean => "mean",
            Self::LastToken => "lasttoken",
        }
    }
}

#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Pooling {
    pub mode: PoolingMode,
    /// The pipeline ends with L2 normalisation (sentence-transformers'
    /// Normalize module).
    pub normalize: bool,
}

#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum PoolingError {
    #[error("embeddings need a folder that declares pooling (1_Pooling/config.json)")]
    NotDeclared,
    #[error("{file}: {message}")]
    Invalid { file: String, message: String },
    #[error("{file}: {mode} pooling is not supported (supported: cls, mean, lasttoken)")]
    Unsupported { file: String, mode: String },
}

/// The `pooling_mode_*` flags sentence-transformers writes, and the mode
/// each names (None: known, not supported here).
const FLAGS: [(&str, Option<PoolingMode>); 6] = [
    ("pooling_mode_cls_token", Some(PoolingMode::Cls)),
    ("pooling_mode_mean_tokens", Some(PoolingMode::Mean)),
    ("pooling_mode_lasttoken", Some(PoolingMode::LastToken)),
    ("pooling_mode_max_tokens", None),
    ("pooling_mode_mean_sqrt_len_tokens", None),
    ("pooling_mode_weightedmean_tokens", None),
];

impl Pooling {
    /// Reads the pipeline of the folder `dir`, or why it serves no embeddings.
    pub fn read(dir: &Path) -> Result<Self, PoolingError> {
        let (pooling_dir, normalize) = match read_json(&dir.join("modules.json"))? {
            Some(modules) => pipeline(&modules)?,
            // No module list: the conventional folder names, as a
            // sentence-transformers save without modules.json lays them out.
            None => ("1_Pooling".to_owned(), dir.join("2_Normalize").is_dir()),
        };
        let file = dir.join(&pooling_dir).join("config.json");
        let config = read_json(&file)?.ok_or(PoolingError::NotDeclared)?;
        let mode = mode(&config, &file.display().to_string())?;
        Ok(Self { mode, normalize })
    }
}

/// The Pooling module's folder and whether a Normalize module follows.
fn pipeline(modules: &Value) -> Result<(String, bool), PoolingError> {
    let invalid = |message: &str| PoolingError::Invalid { file: "modules.json".into(), message: message.into() };
    let list = modules.as_array().ok_or_else(|| invalid("expected a list of modules"))?;
    let kind = |m: &Value| m.get("type").and_then(Value::as_str).unwrap_or("").rsplit('.').next().map(str::to_owned);
    let pooling = list.iter().find(|m| kind(m).as_deref() == Some("Pooling")).ok_or(PoolingError::NotDeclared)?;
    let path =
        pooling.get("path").and_then(Value::as_str).ok_or_else(|| invalid("the Pooling module has no `path`"))?;
    if path.contains("..") || path.starts_with('/') {
        return Err(invalid("the Pooling module's `path` must stay inside the folder"));
    }
    let normalize = list.iter().any(|m| kind(m).as_deref() == Some("Normalize"));
    Ok((path.to_owned(), normalize))
}

/// The one mode the Pooling config sets (newer configs may also name it
/// in `pooling_mode`).
fn mode(config: &Value, file: &str) -> Result<PoolingMode, PoolingError> {
    if let Some(name) = config.get("pooling_mode").and_then(Value::as_str) {
        return match name {
            "cls" => Ok(PoolingMode::Cls),
            "mean" => Ok(PoolingMode::Mean),
            "lasttoken" => Ok(PoolingMode::LastToken),
            other => Err(PoolingError::Unsupported { file: file.into(), mode: other.into() }),
        };
    }
    let set: Vec<&(&str, Option<PoolingMode>)> =
        FLAGS.iter().filter(|(key, _)| config.get(*key).and_then(Value::as_bool) == Some(true)).collect();
    match set.as_slice() {
        [(_, Some(mode))] => Ok(*mode),
        [(key, None)] => Err(PoolingError::Unsupported {
            file: file.into(),
            mode: key.trim_start_matches("pooling_mode_").trim_end_matches("_tokens").into(),
        }),
        [] => Err(PoolingError::Invalid { file: file.into(), message: "no pooling_mode_* flag is set".into() }),
        _ => Err(PoolingError::Invalid {
            file: file.into(),
            message: "several pooling modes are set (concatenated poolings are not supported)".into(),
        }),
    }
}

fn read_json(path: &Path) -> Result<Option<Value>, PoolingError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(PoolingError::Invalid { file: path.display().to_string(), message: e.to_string() }),
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| PoolingError::Invalid { file: path.display().to_string(), message: e.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn folder(files: &[(&str, Value)]) -> tempdir::Dir {
        let d = tempdir::Dir::new();
        for (name, v) in files {
            let p = d.0.join(name);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, v.to_string()).unwrap();
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
                    "pooling-{}-{}",
                    std::process::id(),
                    N.fetch_add(1, Ordering::SeqCst)
                ));
                std::fs::create_dir_all(&p).unwrap();
                Self(p)
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    fn modules(normalize: bool) -> Value {
        let mut m = vec![
            json!({"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}),
            json!({"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}),
        ];
        if normalize {
            m.push(
                json!({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}),
            );
        }
        Value::Array(m)
    }

    #[test]
    fn the_pipeline_names_the_mode_and_the_normalisation() {
        let d = folder(&[
            ("modules.json", modules(true)),
            ("1_Pooling/config.json", json!({"pooling_mode_lasttoken": true, "pooling_mode_mean_tokens": false})),
        ]);
        assert_eq!(Pooling::read(&d.0), Ok(Pooling { mode: PoolingMode::LastToken, normalize: true }));
        let d = folder(&[("modules.json", modules(false)), ("1_Pooling/config.json", json!({"pooling_mode": "cls"}))]);
        assert_eq!(Pooling::read(&d.0), Ok(Pooling { mode: PoolingMode::Cls, normalize: false }));
    }

    #[test]
    fn a_chat_folder_declares_no_pooling() {
        let d = folder(&[("config.json", json!({}))]);
        assert_eq!(Pooling::read(&d.0), Err(PoolingError::NotDeclared));
        let d = folder(&[(
            "modules.json",
            json!([{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}]),
        )]);
        assert_eq!(Pooling::read(&d.0), Err(PoolingError::NotDeclared));
    }

    #[test]
    fn unsupported_and_ambiguous_modes_are_refused() {
        let d = folder(&[
            ("modules.json", modules(true)),
            ("1_Pooling/config.json", json!({"pooling_mode_max_tokens": true})),
        ]);
        assert!(matches!(Pooling::read(&d.0), Err(PoolingError::Unsupported { mode, .. }) if mode == "max"));
        let d = folder(&[
            ("modules.json", modules(true)),
            ("1_Pooling/config.json", json!({"pooling_mode_cls_token": true, "pooling_mode_mean_tokens": true})),
        ]);
        assert!(matches!(Pooling::read(&d.0), Err(PoolingError::Invalid { .. })));
    }
}
