//! `host bench --model shape:FILE`: a model folder of random weights made
//! from a shape file, for benchmarks on machines without a model hub. The
//! file is data (tests/bench/shapes/*.json): the config.json to write, the
//! tensors to draw (`tensors`, and `layer_tensors` with `{i}` for each of
//! `layers` layers). Norm weights (names ending in `norm.weight`) are ones,
//! the rest normal(0, 0.02), all bf16. Made once, under the system's
//! temporary folder, named after the file.

use anyhow::{bail, Context, Result};
use mlx_rs::{random, Array, Dtype};
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

#[derive(Deserialize)]
struct ShapeFile {
    config: serde_json::Value,
    tensors: BTreeMap<String, Vec<i32>>,
    #[serde(default)]
    layers: usize,
    #[serde(default)]
    layer_tensors: BTreeMap<String, Vec<i32>>,
}

/// The folder `model` names: itself, or for `shape:FILE` the random folder
/// that file describes (made on first use).
pub fn resolve(model: &Path) -> Result<PathBuf> {
    let Some(file) = model.to_str().and_then(|m| m.strip_prefix("shape:")) else { return Ok(model.to_path_buf()) };
    let text = std::fs::read_to_string(file).with_context(|| format!("reading the shape file {file}"))?;
    let shape: ShapeFile = serde_json::from_str(&text).with_context(|| format!("the shape file {file}"))?;
    if !shape.config.is_object() || shape.tensors.is_empty() {
        bail!("the shape file {file} needs a `config` object and `tensors`");
    }
    let name = Path::new(file).file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let dir = std::env::temp_dir().join("mlx-engine-shapes").join(name);
    if dir.join("config.json").exists() {
        return Ok(dir);
    }
    // Each process writes its own partial folder: two commands that resolve
    // the same shape at once must not write (or remove) each other's files.
    let tmp = dir.with_extension(format!("partial-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    std::fs::write(tmp.join("config.json"), serde_json::to_string_pretty(&shape.config)?)?;
    eprintln!("making random weights from {file} in {}", dir.display());
    let mut draw = Draw { key: random::key(0)? };
    draw.save(&tmp.join("model-top.safetensors"), shape.tensors.iter().map(|(n, s)| (n.clone(), s)))?;
    // One file per layer keeps each write small (the folder loads every
    // *.safetensors in it).
    for i in 0..shape.layers {
        let named = shape.layer_tensors.iter().map(|(n, s)| (n.replace("{i}", &i.to_string()), s));
        draw.save(&tmp.join(format!("model-layer-{i:03}.safetensors")), named)?;
    }
    if let Err(e) = std::fs::rename(&tmp, &dir) {
        let _ = std::fs::remove_dir_all(&tmp);
        // Another process put the same folder in place first: use it.
        if !dir.join("config.json").exists() {
            return Err(e).with_context(|| format!("moving {} into place", tmp.display()));
        }
    }
    Ok(dir)
}

/// Random tensors from one key chain.
struct Draw {
    key: Array,
}

impl Draw {
    fn tensor(&mut self, name: &str, shape: &[i32]) -> Result<Array> {
        let a = if name.ends_with("norm.weight") {
            Array::ones::<f32>(shape)?
        } else {
            let (next, sub) = random::split(&self.key, 2)?;
            self.key = next;
            random::normal::<f32>(shape, None, 0.02, &sub)?
        };
        Ok(a.as_dtype(Dtype::Bfloat16)?)
    }

    fn save<'a>(&mut self, path: &Path, tensors: impl Iterator<Item = (String, &'a Vec<i32>)>) -> Result<()> {
        let mut out = HashMap::new();
        for (name, shape) in tensors {
            let t = self.tensor(&name, shape)?;
            out.insert(name, t);
        }
        Array::save_safetensors(out, None, path).with_context(|| format!("writing {}", path.display()))
    }
}
