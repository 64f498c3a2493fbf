//! Reading an untrusted config.json: typed getters with clear errors, and
//! quantization parameters validated before MLX ever sees them.

use crate::{error, Result};
use serde_json::Value;

pub struct Config(pub Value);

impl Config {
    pub fn parse(text: &str) -> Result<Self> {
        let v: Value = serde_json::from_str(text).map_err(|e| error(format!("config.json: {e}")))?;
        if !v.is_object() {
            return Err(error("config.json: not a JSON object"));
        }
        Ok(Self(v))
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.0.get(key).filter(|v| !v.is_null())
    }

    pub fn usize(&self, key: &str) -> Result<usize> {
        self.opt_usize(key)?.ok_or_else(|| error(format!("config.json: `{key}` is required")))
    }

    pub fn opt_usize(&self, key: &str) -> Result<Option<usize>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .filter(|n| *n > 0 && *n < (1 << 31))
                .map(|n| Some(n as usize))
                .ok_or_else(|| error(format!("config.json: `{key}` must be a positive integer, got {v}"))),
        }
    }

    pub fn f32_or(&self, key: &str, default: f32) -> Result<f32> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v
                .as_f64()
                .map(|f| f as f32)
                .ok_or_else(|| error(format!("config.json: `{key}` must be a number, got {v}"))),
        }
    }

    pub fn bool_or(&self, key: &str, default: bool) -> Result<bool> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v.as_bool().ok_or_else(|| error(format!("config.json: `{key}` must be true or false, got {v}"))),
        }
    }

    pub fn str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(Value::as_str)
    }

    /// `quantization` as mlx_lm.convert writes it, validated.
    pub fn quantization(&self) -> Result<Option<Quantization>> {
        let Some(q) = self.get("quantization").or_else(|| self.get("quantization_config")) else {
            return Ok(None);
        };
        let default = QuantParams::from_value(q, "quantization")?;
        let mut overrides = Vec::new();
        if let Some(obj) = q.as_object() {
            for (k, v) in obj {
                if matches!(k.as_str(), "group_size" | "bits" | "mode" | "quant_method") {
                    continue;
                }
                match v {
                    Value::Bool(false) => overrides.push((k.clone(), None)),
                    Value::Object(_) => overrides.push((k.clone(), Some(QuantParams::from_value(v, k)?))),
                    _ => {}
                }
            }
        }
        Ok(Some(Quantization { default, overrides }))
    }
}

/// Affine quantization parameters of one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuantParams {
    pub group_size: i32,
    pub bits: i32,
}

impl QuantParams {
    /// The bit widths and group sizes MLX's affine kernels implement; anything
    /// else is refused here, never passed to MLX.
    pub fn new(group_size: i64, bits: i64) -> Result<Self> {
        if ![2, 3, 4, 5, 6, 8].contains(&bits) {
            return Err(error(format!("quantization: bits must be 2, 3, 4, 5, 6 or 8, got {bits}")));
        }
        if ![32, 64, 128].contains(&group_size) {
            return Err(error(format!("quantization: group_size must be 32, 64 or 128, got {group_size}")));
        }
        Ok(Self { group_size: group_size as i32, bits: bits as i32 })
    }

    fn from_value(v: &Value, what: &str) -> Result<Self> {
        let mode = v.get("mode").and_then(Value::as_str).unwrap_or("affine");
        if mode != "affine" {
            return Err(error(format!("{what}: quantization mode `{mode}` is not supported (affine only)")));
        }
        let g =
            v.get("group_size").and_then(Value::as_i64).ok_or_else(|| error(format!("{what}: group_size missing")))?;
        let b = v.get("bits").and_then(Value::as_i64).ok_or_else(|| error(format!("{what}: bits missing")))?;
        Self::new(g, b)
    }
}

/// The checkpoint's quantization: a default and per-layer overrides
/// (`false` = that layer is not quantized).
#[derive(Debug, Clone)]
pub struct Quantization {
    pub default: QuantParams,
    pub overrides: Vec<(String, Option<QuantParams>)>,
}

impl Quantization {
    /// Parameters for the layer at `path` (e.g. `model.layers.0.mlp.up_proj`).
    pub fn for_layer(&self, path: &str) -> Option<QuantParams> {
        match self.overrides.iter().find(|(k, _)| k == path) {
            Some((_, p)) => *p,
            None => Some(self.default),
        }
    }
}
