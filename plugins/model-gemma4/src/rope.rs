//! RoPE per attention type, as mlx-lm's `initialize_rope` builds it from
//! `rope_parameters[<layer type>]`: model-kit's variants (default, linear,
//! llama3), plus Gemma 4's `proportional` partial rotation, which model-kit
//! does not have.

use mlx_rs::ops;
use model_kit::rope::{Position, Rope};
use model_kit::{error, Array, Result};
use serde_json::Value;

pub enum LayerRope {
    Kit(Rope),
    /// mlx-lm's `ProportionalRoPE`: `mx.fast.rope` over all `dims` with
    /// explicit frequencies, of which the last `(dims - rotated) / 2` are
    /// infinite (angle 0: those dims pass through unrotated).
    Proportional {
        dims: i32,
        traditional: bool,
        freqs: Array,
    },
}

impl LayerRope {
    /// `dims` is the layer's head dim; `params` the type's rope_parameters.
    pub fn new(dims: usize, base: f32, traditional: bool, params: &Value) -> Result<Self> {
        let kind = params
            .get("type")
            .and_then(Value::as_str)
            .or_else(|| params.get("rope_type").and_then(Value::as_str))
            .unwrap_or("default");
        if kind != "proportional" {
            return Ok(Self::Kit(Rope::new(dims as i32, base, traditional, Some(params))?));
        }
        let num = |k: &str| {
            params
                .get(k)
                .filter(|v| !v.is_null())
                .map(|v| v.as_f64().ok_or_else(|| error(format!("rope_parameters: `{k}` must be a number"))))
        };
        let fraction = num("partial_rotary_factor").transpose()?.unwrap_or(1.0);
        let factor = num("factor").transpose()?.unwrap_or(1.0) as f32;
        // Python's int(dims * partial_rotary_factor) truncates toward zero.
        let rotated = (dims as f64 * fraction) as i64;
        if rotated > dims as i64 || rotated < 0 {
            return Err(error(format!(
                "rope_parameters: partial_rotary_factor {fraction} rotates {rotated} of {dims} dims"
            )));
        }
        let freqs = proportional_freqs(dims as i32, rotated as i32, base, factor)?;
        Ok(Self::Proportional { dims: dims as i32, traditional, freqs })
    }

    /// The frequencies to evaluate at load (proportional only).
    pub fn freqs(&self) -> Option<&Array> {
        match self {
            Self::Kit(_) => None,
            Self::Proportional { freqs, .. } => Some(freqs),
        }
    }

    pub fn apply(&self, x: &Array, pos: &Position) -> Result<Array> {
        match self {
            Self::Kit(r) => r.apply(x, pos),
            Self::Proportional { dims, traditional, freqs } => match pos {
                Position::Offset(o) => mlx_rs::fast::rope(x, *dims, *traditional, None, 1.0, *o, freqs),
                Position::PerRow(o) => mlx_rs::fast::rope_dynamic(x, *dims, *traditional, None, 1.0, o, freqs),
            },
        }
    }
}

/// `concat([factor * base ** (arange(0, rotated, 2, f32) / dims), full(((dims - rotated) // 2,), inf)])`
/// with the same float32 ops as mlx-lm.
fn proportional_freqs(dims: i32, rotated: i32, base: f32, factor: f32) -> Result<Array> {
    let exponents = Array::arange::<_, f32>(0.0, rotated as f32, 2.0)?.divide(Array::from_f32(dims as f32))?;
    let rotating = Array::from_f32(factor).multiply(ops::power(Array::from_f32(base), &exponents)?)?;
    let still = (dims - rotated) / 2;
    if still == 0 {
        return Ok(rotating);
    }
    let inf = Array::full::<f32>(&[still], Array::from_f32(f32::INFINITY))?;
    ops::concatenate(&[rotating, inf], 0)
}
