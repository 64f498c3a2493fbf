//! One token's keys (or values) as a row of codes: `mx.quantize` along the
//! head dimension gives packed values (uint32 words), one scale and one bias
//! per group, in the compute dtype. They travel as ONE row of unsigned words
//! of the compute dtype's width (uint32 for float32, uint16 for 16-bit
//! floats): `[words | scales | biases]`, each bit-cast (`view`), so a layout
//! moves a token's codes with the same column operations it uses for plain
//! K/V, and every copy it makes is bitwise.

use model_kit::ops::{dtype_size, slice};
use model_kit::{error, Array, Dtype, Result};
use plugin_sdk::mlx_rs;

/// What one token of a layer is made of, per head: the width of its key and
/// value rows and their dtype (the model's for plain K/V, unsigned words for
/// codes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Widths {
    pub k: i32,
    pub v: i32,
    pub dtype: Dtype,
}

impl Widths {
    /// Bytes of one token's key and value rows, per head and row.
    pub fn token_bytes(&self) -> u64 {
        ((self.k + self.v) as usize * dtype_size(self.dtype)) as u64
    }
}

/// mlx-lm's affine K/V quantization: `bits` per element, one scale and bias
/// per `group` elements of a head's row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Affine {
    pub bits: i32,
    pub group: i32,
}

/// The three parts `mx.quantize` returns, as `quantized_matmul` takes them.
pub struct Codes {
    pub words: Array,
    pub scales: Array,
    pub biases: Array,
}

impl Affine {
    /// 4 or 8 bits, groups of 32, 64 or 128 (what the flags allow).
    pub fn new(bits: i32, group: i32) -> Result<Self> {
        if !matches!(bits, 4 | 8) {
            return Err(error(format!("affine K/V: {bits} bits (4 or 8)")));
        }
        if !matches!(group, 32 | 64 | 128) {
            return Err(error(format!("affine K/V: group size {group} (32, 64 or 128)")));
        }
        Ok(Self { bits, group })
    }

    /// The unsigned word type codes of `dtype` values are stored in.
    pub fn storage(dtype: Dtype) -> Result<Dtype> {
        match dtype {
            Dtype::Float32 => Ok(Dtype::Uint32),
            Dtype::Bfloat16 | Dtype::Float16 => Ok(Dtype::Uint16),
            other => Err(error(format!("affine K/V: cannot quantize {other:?} keys and values"))),
        }
    }

    /// Storage words per packed uint32 word.
    fn per_word(dtype: Dtype) -> Result<i32> {
        Ok(4 / dtype_size(Self::storage(dtype)?) as i32)
    }

    /// Fails unless a head row of `dim` elements splits into whole groups.
    pub fn check(&self, dim: i32) -> Result<()> {
        if dim <= 0 || dim % self.group != 0 {
            return Err(error(format!(
                "a head dimension of {dim} cannot be quantized in groups of {} (--kv-group-size must divide it)",
                self.group
            )));
        }
        Ok(())
    }

    /// Storage words of one head row of `dim` values in `dtype`.
    pub fn width(&self, dim: i32, dtype: Dtype) -> Result<i32> {
        self.check(dim)?;
        Ok(dim * self.bits / 32 * Self::per_word(dtype)? + 2 * (dim / self.group))
    }

    /// The code widths of a layer whose plain K/V are `plain`.
    pub fn packed(&self, plain: Widths) -> Result<Widths> {
        Ok(Widths {
            k: self.width(plain.k, plain.dtype)?,
            v: self.width(plain.v, plain.dtype)?,
            dtype: Self::storage(plain.dtype)?,
        })
    }

    /// `mx.quantize(x, group_size, bits)` along the last axis.
    pub fn quantize(&self, x: &Array) -> Result<Codes> {
        let (words, scales, biases) = mlx_rs::ops::quantize(x, self.group, self.bits)?;
        Ok(Codes { words, scales, biases })
    }

    /// `x [.., D]` in a float dtype as code rows `[.., width]`.
    pub fn encode(&self, x: &Array) -> Result<Array> {
        let storage = Self::storage(x.dtype())?;
        let c = self.quantize(x)?;
        let parts = [c.words.view_dtype(storage)?, c.scales.view_dtype(storage)?, c.biases.view_dtype(storage)?];
        mlx_rs::ops::concatenate(&parts, -1)
    }

    /// Code rows `[.., width]` back into the parts of `dim`-wide rows of
    /// `dtype` values (bit-casts of slices: no arithmetic).
    pub fn decode(&self, codes: &Array, dim: i32, dtype: Dtype) -> Result<Codes> {
        let n_words = dim * self.bits / 32 * Self::per_word(dtype)?;
        let n_groups = dim / self.group;
        if codes.shape().last().copied() != Some(n_words + 2 * n_groups) {
            return Err(error(format!(
                "affine K/V: code rows of width {:?} for a head dimension of {dim}",
                codes.shape().last()
            )));
        }
        let part = |from: i32, to: i32, as_: Dtype| -> Result<Array> {
            let shape = codes.shape();
            let mut start = vec![0; shape.len()];
            let mut stop = shape.to_vec();
            *start.last_mut().unwrap() = from;
            *stop.last_mut().unwrap() = to;
            slice(codes, &start, &stop)?.view_dtype(as_)
        };
        Ok(Codes {
            words: part(0, n_words, Dtype::Uint32)?,
            scales: part(n_words, n_words + n_groups, dtype)?,
            biases: part(n_words + n_groups, n_words + 2 * n_groups, dtype)?,
        })
    }
}
