//! Rotary position embeddings as mlx-lm's `initialize_rope` builds them:
//! default, linear scaling, Llama-3 frequency scaling and Gemma 4's
//! proportional partial rotation. Other types are refused with a clear
//! error rather than silently computed wrong.

use crate::{error, Array, Result};
use serde_json::Value;

/// Where the new tokens sit: one offset for all rows, or one per row.
pub enum Position {
    Offset(i32),
    PerRow(Array),
}

/// A rotation's constants: the base (or per-pair `freqs`) and the
/// position scale.
pub(crate) struct PlainRope<'a> {
    /// The rotated dims, the first of each head.
    pub dims: i32,
    pub base: Option<f32>,
    pub scale: f32,
    pub freqs: Option<&'a Array>,
}

pub struct Rope {
    dims: i32,
    traditional: bool,
    base: Option<f32>,
    scale: f32,
    freqs: Option<Array>,
}

impl Rope {
    pub fn new(dims: i32, base: f32, traditional: bool, scaling: Option<&Value>) -> Result<Self> {
        let plain = |scale: f32| Ok(Self { dims, traditional, base: Some(base), scale, freqs: None });
        let Some(cfg) = scaling.filter(|v| !v.is_null()) else { return plain(1.0) };
        let kind = cfg.get("type").or_else(|| cfg.get("rope_type")).and_then(Value::as_str).unwrap_or("default");
        let num = |k: &str, d: f64| cfg.get(k).and_then(Value::as_f64).unwrap_or(d);
        match kind {
            "default" => plain(1.0),
            "linear" => {
                let factor = cfg
                    .get("factor")
                    .and_then(Value::as_f64)
                    .ok_or_else(|| error("rope_scaling: linear needs `factor`"))?;
                plain((1.0 / factor) as f32)
            }
            "llama3" => {
                let factor = cfg
                    .get("factor")
                    .and_then(Value::as_f64)
                    .ok_or_else(|| error("rope_scaling: llama3 needs `factor`"))?;
                let freqs = llama3_freqs(
                    dims,
                    base,
                    factor as f32,
                    num("low_freq_factor", 1.0) as f32,
                    num("high_freq_factor", 4.0) as f32,
                    num("original_max_position_embeddings", 8192.0) as f32,
                )?;
                Ok(Self { dims, traditional, base: None, scale: 1.0, freqs: Some(freqs) })
            }
            "proportional" => {
                let strict = |k: &str| -> Result<Option<f64>> {
                    match cfg.get(k).filter(|v| !v.is_null()) {
                        None => Ok(None),
                        Some(v) => v
                            .as_f64()
                            .map(Some)
                            .ok_or_else(|| error(format!("rope_parameters: `{k}` must be a number"))),
                    }
                };
                let fraction = strict("partial_rotary_factor")?.unwrap_or(1.0);
                let factor = strict("factor")?.unwrap_or(1.0) as f32;
                // Python's int(dims * partial_rotary_factor) truncates toward zero.
                let rotated = (dims as f64 * fraction) as i64;
                if rotated > dims as i64 || rotated < 0 {
                    return Err(error(format!(
                        "rope_parameters: partial_rotary_factor {fraction} rotates {rotated} of {dims} dims"
                    )));
                }
                let freqs = proportional_freqs(dims, rotated as i32, base, factor)?;
                Ok(Self { dims, traditional, base: None, scale: 1.0, freqs: Some(freqs) })
            }
            other => Err(error(format!("rope_scaling type `{other}` is not supported by this family plugin"))),
        }
    }

    /// Explicit frequencies (Llama-3, proportional): an array a loader
    /// evaluates with the weights.
    /// What a fused kernel needs of a rotation over the first dims of a
    /// `head_dim` head (all of it, or part) in the non-traditional
    /// (half-split) layout; `None` for any other.
    pub(crate) fn plain_parts(&self, head_dim: i32) -> Option<PlainRope<'_>> {
        (!self.traditional && self.dims <= head_dim).then_some(PlainRope {
            dims: self.dims,
            base: self.base,
            scale: self.scale,
            freqs: self.freqs.as_ref(),
        })
    }

    pub fn freqs(&self) -> Option<&Array> {
        self.freqs.as_ref()
    }

    pub fn apply(&self, x: &Array, pos: &Position) -> Result<Array> {
        match pos {
            Position::Offset(o) => {
                mlx_rs::fast::rope(x, self.dims, self.traditional, self.base, self.scale, *o, self.freqs.as_ref())
            }
            Position::PerRow(o) => mlx_rs::fast::rope_dynamic(
                x,
                self.dims,
                self.traditional,
                self.base,
                self.scale,
                o,
                self.freqs.as_ref(),
            ),
        }
    }
}

/// Llama-3 frequencies, with the same MLX ops (and float32 rounding) as
/// mlx-lm's `Llama3RoPE`.
fn llama3_freqs(dims: i32, base: f32, factor: f32, low: f32, high: f32, old_ctx: f32) -> Result<Array> {
    use mlx_rs::ops;
    let low_wavelen = old_ctx / low;
    let high_wavelen = old_ctx / high;
    let idx = Array::arange::<_, i32>(0, dims, 2)?;
    let exponent = idx.divide(Array::from_int(dims))?;
    let freqs = ops::power(Array::from_f32(base), &exponent)?;
    let wavelens = freqs.multiply(Array::from_f32(2.0 * std::f32::consts::PI))?;
    let freqs =
        ops::select(&wavelens.gt(Array::from_f32(low_wavelen))?, freqs.multiply(Array::from_f32(factor))?, &freqs)?;
    let medium = wavelens.gt(Array::from_f32(high_wavelen))?.logical_and(wavelens.lt(Array::from_f32(low_wavelen))?)?;
    let smooth = Array::from_f32(old_ctx)
        .divide(&wavelens)?
        .subtract(Array::from_f32(low))?
        .divide(Array::from_f32(high - low))?;
    let one = Array::from_f32(1.0);
    let denom = one.subtract(&smooth)?.divide(Array::from_f32(factor))?.add(&smooth)?;
    let smooth_freqs = freqs.divide(&denom)?;
    ops::select(&medium, &smooth_freqs, &freqs)
}

/// mlx-lm's `ProportionalRoPE`: `mx.fast.rope` over all `dims` with
/// frequencies `factor * base ** (arange(0, rotated, 2) / dims)` followed by
/// `(dims - rotated) / 2` infinite ones (angle 0: those dims pass through
/// unrotated), with the same float32 ops as mlx-lm.
fn proportional_freqs(dims: i32, rotated: i32, base: f32, factor: f32) -> Result<Array> {
    use mlx_rs::ops;
    let exponents = Array::arange::<_, f32>(0.0, rotated as f32, 2.0)?.divide(Array::from_f32(dims as f32))?;
    let rotating = Array::from_f32(factor).multiply(ops::power(Array::from_f32(base), &exponents)?)?;
    let still = (dims - rotated) / 2;
    if still == 0 {
        return Ok(rotating);
    }
    let inf = Array::full::<f32>(&[still], Array::from_f32(f32::INFINITY))?;
    ops::concatenate(&[rotating, inf], 0)
}
