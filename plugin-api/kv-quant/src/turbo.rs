//! TurboQuant K/V (Zandieh et al. 2025, the MSE variant): keys as affine
//! codes (attended by quantized matmuls, as the affine schemes), values
//! rotated by a randomized Hadamard transform and each coordinate
//! quantized by the Lloyd-Max quantizer of N(0, 1) after scaling the row to
//! norm sqrt(d); the row's norm is kept beside its level indices.
//!
//! A value row's codes: `[index words | norm]`, the indices packed
//! `32 / bits` to a uint32 word (in storage words of the compute dtype's
//! width, as the affine codes), the norm as float32. Attention sums the
//! ROTATED values under the softmax weights and rotates the result back
//! once per query (`out = (p Ṽ) R`), never each stored row.

use crate::codec::{Affine, Codes, Widths};
use crate::lloyd_max;
use crate::rotation::randomized_hadamard;
use model_kit::ops::{dtype_size, slice};
use model_kit::{error, Array, Dtype, Result};
use plugin_sdk::mlx_rs;

/// The seed of the value rotation's signs (any fixed value: states carry
/// codes made with it).
const ROTATION_SEED: u64 = 0x7475_7262_6f71_7561;

/// TurboQuant with `k`-bit affine keys and `v`-bit rotated Lloyd-Max values.
#[derive(Clone, Debug, PartialEq)]
pub struct Turbo {
    pub keys: Affine,
    pub v_bits: u32,
    /// Lloyd-Max levels of N(0, 1), ascending, and their boundaries.
    levels: Vec<f32>,
    thresholds: Vec<f32>,
}

impl Turbo {
    /// Keys at 2-6 or 8 bits (mlx's affine widths), values at 2-5 bits.
    pub fn new(k_bits: i32, v_bits: u32, group: i32) -> Result<Self> {
        let keys = Affine::any_width(k_bits, group)?;
        if !(2..=5).contains(&v_bits) {
            return Err(error(format!("turbo K/V: values at {v_bits} bits (2 to 5)")));
        }
        let lv = lloyd_max::levels(v_bits);
        let thresholds = lloyd_max::thresholds(&lv).into_iter().map(|t| t as f32).collect();
        Ok(Self { keys, v_bits, levels: lv.into_iter().map(|l| l as f32).collect(), thresholds })
    }

    /// Indices per uint32 word.
    fn per_word(&self) -> i32 {
        32 / self.v_bits as i32
    }

    fn words(&self, dim: i32) -> i32 {
        (dim + self.per_word() - 1) / self.per_word()
    }

    /// The rotation for head rows of `dim` values, `[dim, dim]` float32.
    fn rotation(&self, dim: i32) -> Result<Array> {
        let r = randomized_hadamard(dim as usize, ROTATION_SEED)
            .ok_or_else(|| error(format!("turbo K/V: the value head dimension {dim} is no power of two")))?;
        Ok(Array::from_slice(&r, &[dim, dim]))
    }

    /// Fails unless rows of `dim` keys and values can be coded.
    pub fn check(&self, plain: Widths) -> Result<()> {
        self.keys.check(plain.k)?;
        self.rotation(plain.v).map(|_| ())
    }

    /// The code widths of a layer whose plain K/V are `plain`.
    pub fn packed(&self, plain: Widths) -> Result<Widths> {
        self.check(plain)?;
        let storage = Affine::storage(plain.dtype)?;
        let per = 4 / dtype_size(storage) as i32;
        Ok(Widths { k: self.keys.width(plain.k, plain.dtype)?, v: (self.words(plain.v) + 1) * per, dtype: storage })
    }

    /// Value rows `[.., D]` as code rows.
    pub fn encode_values(&self, v: &Array) -> Result<Array> {
        let storage = Affine::storage(v.dtype())?;
        let dim = *v.shape().last().unwrap();
        let (idx, norm) = self.quantize(v)?;
        let words = self.pack(&idx, dim)?;
        mlx_rs::ops::concatenate(&[words.view_dtype(storage)?, norm.view_dtype(storage)?], -1)
    }

    /// Level indices (uint32 `[.., D]`) of the rotated, rescaled rows, and
    /// each row's norm (float32 `[.., 1]`).
    pub fn quantize(&self, v: &Array) -> Result<(Array, Array)> {
        let dim = *v.shape().last().unwrap();
        let x = v.as_dtype(Dtype::Float32)?;
        let y = x.matmul(self.rotation(dim)?.transpose()?)?;
        let norm = y.square()?.sum_axis(-1, true)?.sqrt()?;
        // A zero row (padding) stays zero: any scale works, 1 avoids 0/0.
        let safe = mlx_rs::ops::select(&norm.gt(Array::from_f32(0.0))?, &norm, Array::from_f32(1.0))?;
        let z = y.multiply(Array::from_f32((dim as f32).sqrt()))?.divide(&safe)?;
        let t = Array::from_slice(&self.thresholds, &[self.thresholds.len() as i32]);
        let idx = z.expand_dims(-1)?.gt(&t)?.as_dtype(Dtype::Uint32)?.sum_axis(-1, false)?;
        Ok((idx, norm))
    }

    /// uint32 indices `[.., D]` packed `per_word` to a word: `[.., words]`.
    fn pack(&self, idx: &Array, dim: i32) -> Result<Array> {
        let (per, words) = (self.per_word(), self.words(dim));
        let mut shape = idx.shape().to_vec();
        let lead: Vec<i32> = shape[..shape.len() - 1].to_vec();
        let padded = if words * per > dim {
            let mut pad_shape = lead.clone();
            pad_shape.push(words * per - dim);
            let zeros = model_kit::ops::zeros(&pad_shape, Dtype::Uint32)?;
            mlx_rs::ops::concatenate(&[idx.clone(), zeros], -1)?
        } else {
            idx.clone()
        };
        shape = lead.clone();
        shape.extend([words, per]);
        let place: Vec<u32> = (0..per).map(|j| 1u32 << (self.v_bits as i32 * j)).collect();
        let place = Array::from_slice(&place, &[per]);
        padded.reshape(&shape)?.multiply(&place)?.sum_axis(-1, false)
    }

    /// Code rows back into the rotated, scaled values `[.., D]` (float32).
    pub fn decode_values(&self, codes: &Array, dim: i32, dtype: Dtype) -> Result<Array> {
        let storage = Affine::storage(dtype)?;
        let per_storage = 4 / dtype_size(storage) as i32;
        let (words, per) = (self.words(dim), self.per_word());
        let shape = codes.shape().to_vec();
        let n = shape.len();
        let part = |from: i32, to: i32| -> Result<Array> {
            let mut start = vec![0; n];
            let mut stop = shape.clone();
            (start[n - 1], stop[n - 1]) = (from, to);
            slice(codes, &start, &stop)
        };
        let w = part(0, words * per_storage)?.view_dtype(Dtype::Uint32)?;
        let norm = part(words * per_storage, (words + 1) * per_storage)?.view_dtype(Dtype::Float32)?;
        let place: Vec<u32> = (0..per).map(|j| 1u32 << (self.v_bits as i32 * j)).collect();
        let place = Array::from_slice(&place, &[per]);
        let idx =
            w.expand_dims(-1)?.floor_divide(&place)?.remainder(Array::from_slice(&[1u32 << self.v_bits], &[1]))?;
        let mut flat = shape[..n - 1].to_vec();
        flat.push(words * per);
        let idx = idx.reshape(&flat)?;
        let idx = {
            let mut start = vec![0; n];
            let mut stop = flat.clone();
            (start[n - 1], stop[n - 1]) = (0, dim);
            slice(&idx, &start, &stop)?
        };
        let levels = Array::from_slice(&self.levels, &[self.levels.len() as i32]);
        let z = levels.take(&idx)?;
        z.multiply(&norm.divide(Array::from_f32((dim as f32).sqrt()))?)
    }

    /// Attention of `q` `[B, Hq, L, D]` over key codes (affine) and value
    /// codes: scores exactly as the affine schemes make them, then the
    /// softmax weights times the rotated values, rotated back.
    #[allow(clippy::too_many_arguments)]
    pub fn attend(
        &self,
        route: crate::Route,
        q: &Array,
        keys: &Codes,
        values: &Array,
        plain: Widths,
        scale: f32,
        mask: &crate::QMask,
    ) -> Result<Array> {
        if route == crate::Route::Dequantized {
            // Attention is linear in the values: over the rotated values,
            // then rotated back.
            let k = crate::attention::dequantize(keys, self.keys, q.dtype())?;
            let v_rot = self.decode_values(values, plain.v, plain.dtype)?.as_dtype(q.dtype())?;
            let out = model_kit::attention::sdpa(q, &k, &v_rot, scale, &mask.as_mask())?;
            return out.as_dtype(Dtype::Float32)?.matmul(self.rotation(plain.v)?)?.as_dtype(q.dtype());
        }
        let weights = crate::attention::attention_weights(q, keys, scale, mask, self.keys)?;
        let (b, heads, l) = (q.shape()[0], q.shape()[1], q.shape()[2]);
        let kv_heads = keys.words.shape()[1];
        let v_rot = self.decode_values(values, plain.v, plain.dtype)?;
        // Weights [B, Hkv, reps, L, T] (or [B, H, L, T]) over rows [B, Hkv, T, D].
        let v_rot = if heads > kv_heads { v_rot.expand_dims(-3)? } else { v_rot };
        let out = weights.as_dtype(Dtype::Float32)?.matmul(&v_rot)?;
        let out = out.matmul(self.rotation(plain.v)?)?;
        out.reshape(&[b, heads, l, plain.v])?.as_dtype(q.dtype())
    }
}

impl Affine {
    /// Any width mlx's affine quantization packs evenly: 2-6 or 8 bits.
    pub fn any_width(bits: i32, group: i32) -> Result<Self> {
        if !matches!(bits, 2..=6 | 8) {
            return Err(error(format!("turbo K/V: keys at {bits} bits (2 to 6, or 8)")));
        }
        let four = Affine::new(4, group)?;
        Ok(Self { bits, ..four })
    }
}
