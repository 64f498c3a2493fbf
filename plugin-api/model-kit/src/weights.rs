//! The weights of a model folder: `model.safetensors`, or shards listed by
//! `model.safetensors.index.json`, or every `*.safetensors` file. MLX maps
//! them lazily: bytes are read when first evaluated, on the default device's
//! stream. On a GPU that puts each tensor in device memory; read on the CPU
//! stream it would land in managed memory that the GPU migrates page by page
//! on first touch (1.7 s of page faults in the first 4096-token prefill of
//! an 8B model on the H200, docs/benchmarks.md).

use crate::{error, Array, Result};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

pub struct Weights {
    map: HashMap<String, Array>,
}

impl Weights {
    pub fn load(dir: &Path) -> Result<Self> {
        let mut map = HashMap::new();
        for file in weight_files(dir)? {
            let part = mlx_rs::with_stream(&mlx_rs::Stream::new(), || Array::load_safetensors(&file))
                .map_err(|e| error(format!("{}: {e}", file.display())))?;
            map.extend(part);
        }
        if map.is_empty() {
            return Err(error(format!("{}: no tensors found", dir.display())));
        }
        Ok(Self { map })
    }

    /// Removes and returns a tensor; a missing one is an error naming it.
    pub fn take(&mut self, name: &str) -> Result<Array> {
        self.map.remove(name).ok_or_else(|| error(format!("weights: missing tensor `{name}`")))
    }

    pub fn take_opt(&mut self, name: &str) -> Option<Array> {
        self.map.remove(name)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.map.contains_key(name)
    }

    /// Drops tensors the graph does not use (mlx-lm's `sanitize`).
    pub fn drop_matching(&mut self, pred: impl Fn(&str) -> bool) {
        self.map.retain(|k, _| !pred(k));
    }

    /// Drops `prefix` from every name that has it (checkpoints saved with
    /// a wrapper module's `model.` in front).
    pub fn strip_prefix(&mut self, prefix: &str) {
        let map = std::mem::take(&mut self.map);
        self.map = map.into_iter().map(|(k, v)| (k.strip_prefix(prefix).map(str::to_owned).unwrap_or(k), v)).collect();
    }

    /// Names left over after loading: a checkpoint/graph mismatch.
    pub fn remaining(&self) -> Vec<String> {
        let mut v: Vec<String> = self.map.keys().cloned().collect();
        v.sort();
        v
    }
}

fn weight_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let index = dir.join("model.safetensors.index.json");
    if index.exists() {
        let text = std::fs::read_to_string(&index).map_err(|e| error(format!("{}: {e}", index.display())))?;
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| error(format!("{}: {e}", index.display())))?;
        let map = v.get("weight_map").and_then(|m| m.as_object()).ok_or_else(|| error("index: no weight_map"))?;
        let mut files: Vec<String> = map.values().filter_map(|f| f.as_str().map(str::to_owned)).collect();
        files.sort();
        files.dedup();
        return files
            .into_iter()
            .map(|f| {
                // Shard names are untrusted: keep them inside the folder.
                if f.contains('/') || f.contains("..") {
                    Err(error(format!("index: invalid shard name `{f}`")))
                } else {
                    Ok(dir.join(f))
                }
            })
            .collect();
    }
    let single = dir.join("model.safetensors");
    if single.exists() {
        return Ok(vec![single]);
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| error(format!("{}: {e}", dir.display())))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(error(format!("{}: no *.safetensors files", dir.display())));
    }
    Ok(files)
}
