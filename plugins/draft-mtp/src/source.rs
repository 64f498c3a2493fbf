//! Where an MTP head's weights and config live, in the three layouts the
//! Qwen3.5 releases and mlx-vlm use: a drafter folder (`model_type` ending
//! in `_mtp`, tensors unprefixed), a `<model>/mtp/` folder beside the
//! target's weights, or the `mtp.*` tensors inside the target checkpoint
//! itself (Hugging Face layout: the norms stored minus one); and
//! speculators' MTP folder (`speculators.rs`).

use std::path::{Path, PathBuf};

pub struct Source {
    /// The folder whose safetensors hold the head.
    pub dir: PathBuf,
    /// config.json text describing the head (its `text_config`, or the
    /// target's own config for `mtp.*` tensors).
    pub config: String,
    /// Only tensors under `mtp.` belong to the head (inside the target).
    pub inside_target: bool,
    /// speculators' layout (`speculators.rs`): its config and tensor names.
    pub speculators: bool,
}

fn read_config(dir: &Path) -> Option<String> {
    std::fs::read_to_string(dir.join("config.json")).ok()
}

fn model_type(config: &str) -> String {
    serde_json::from_str::<serde_json::Value>(config)
        .ok()
        .and_then(|v| v.get("model_type").and_then(|t| t.as_str()).map(str::to_owned))
        .unwrap_or_default()
}

/// The tensor names of a folder's safetensors (index or file headers),
/// without reading any tensor data.
pub fn tensor_names(dir: &Path) -> Vec<String> {
    if let Ok(text) = std::fs::read_to_string(dir.join("model.safetensors.index.json")) {
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) {
            if let Some(m) = v.get("weight_map").and_then(|m| m.as_object()) {
                return m.keys().cloned().collect();
            }
        }
    }
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut names = Vec::new();
    for e in entries.flatten() {
        let p = e.path();
        if p.extension().is_some_and(|x| x == "safetensors") {
            names.extend(header_names(&p).unwrap_or_default());
        }
    }
    names
}

fn header_names(path: &Path) -> Option<Vec<String>> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).ok()?;
    let mut len = [0u8; 8];
    f.read_exact(&mut len).ok()?;
    let len = u64::from_le_bytes(len);
    if len > 100 << 20 {
        return None;
    }
    let mut header = vec![0u8; len as usize];
    f.read_exact(&mut header).ok()?;
    let v: serde_json::Value = serde_json::from_slice(&header).ok()?;
    Some(v.as_object()?.keys().filter(|k| *k != "__metadata__").cloned().collect())
}

/// speculators' `speculators_model_type`, when the config is one of its.
pub fn speculators_type(config: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(config).ok()?;
    v.get("speculators_model_type").map(|t| t.as_str().unwrap_or("?").to_owned())
}

/// The head `dir` holds: speculators' MTP folder, then the layouts in the
/// order the ancestor detects them. speculators' other algorithms are
/// not heads.
pub fn locate(dir: &Path) -> Option<Source> {
    let config = read_config(dir)?;
    let own = |dir: &Path, config: String, inside_target, speculators| {
        Some(Source { dir: dir.into(), config, inside_target, speculators })
    };
    match speculators_type(&config).as_deref() {
        Some("mtp") => return own(dir, config, false, true),
        Some(_) => return None,
        None => {}
    }
    if model_type(&config).ends_with("_mtp") {
        return own(dir, config, false, false);
    }
    let sub = dir.join("mtp");
    if let Some(c) = read_config(&sub) {
        return own(&sub, c, false, false);
    }
    if tensor_names(dir).iter().any(|n| n.starts_with("mtp.")) {
        return own(dir, config, true, false);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn folder(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("draft-mtp-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// A safetensors file with these (empty f32) tensors.
    fn safetensors(path: &Path, names: &[&str]) {
        let header: serde_json::Map<String, serde_json::Value> = names
            .iter()
            .map(|n| (n.to_string(), serde_json::json!({"dtype": "F32", "shape": [0], "data_offsets": [0, 0]})))
            .collect();
        let h = serde_json::Value::Object(header).to_string();
        let mut bytes = (h.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(h.as_bytes());
        std::fs::write(path, bytes).unwrap();
    }

    #[test]
    fn the_three_layouts_are_found_and_other_folders_are_not() {
        let own = folder("own");
        std::fs::write(own.join("config.json"), r#"{"model_type": "qwen3_5_mtp"}"#).unwrap();
        let s = locate(&own).unwrap();
        assert!(!s.inside_target && s.dir == own);

        let beside = folder("beside");
        std::fs::write(beside.join("config.json"), r#"{"model_type": "qwen3_5"}"#).unwrap();
        std::fs::create_dir_all(beside.join("mtp")).unwrap();
        std::fs::write(beside.join("mtp/config.json"), r#"{"model_type": "qwen3_5_mtp"}"#).unwrap();
        let s = locate(&beside).unwrap();
        assert!(!s.inside_target && s.dir == beside.join("mtp"));

        let inside = folder("inside");
        std::fs::write(inside.join("config.json"), r#"{"model_type": "qwen3_5"}"#).unwrap();
        safetensors(&inside.join("model.safetensors"), &["model.embed_tokens.weight", "mtp.fc.weight"]);
        let s = locate(&inside).unwrap();
        assert!(s.inside_target && s.dir == inside);

        let spec = folder("speculators");
        std::fs::write(spec.join("config.json"), r#"{"speculators_model_type": "mtp"}"#).unwrap();
        let s = locate(&spec).unwrap();
        assert!(s.speculators && !s.inside_target && s.dir == spec);
        std::fs::write(spec.join("config.json"), r#"{"speculators_model_type": "dflash"}"#).unwrap();
        assert!(locate(&spec).is_none());

        let plain = folder("plain");
        std::fs::write(plain.join("config.json"), r#"{"model_type": "qwen3_5"}"#).unwrap();
        safetensors(&plain.join("model.safetensors"), &["model.embed_tokens.weight"]);
        assert!(locate(&plain).is_none());
        for d in [own, beside, inside, spec, plain] {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}
