//! Layers, each computed exactly as MLX's Python `nn` layers compute them
//! (mlx-lm builds on those), so that results match op for op. Each
//! constructor takes the shape config.json implies and refuses a tensor of
//! another shape, naming it (`shape::expect_shape`), before any graph runs.

use crate::config::{QuantParams, Quantization};
use crate::shape::expect_shape;
use crate::shard::Shard;
use crate::weights::Weights;
use crate::{error, Array, Dtype, Result};
use mlx_rs::ops;

/// What layer constructors read from: the checkpoint, its quantization, and
/// the compute dtype the host asked for (None = keep the checkpoint's).
pub struct LoadCtx<'a> {
    pub weights: &'a mut Weights,
    pub quant: Option<&'a Quantization>,
    pub dtype: Option<Dtype>,
    /// Every tensor handed to a layer, so `materialize` can read them all.
    pub loaded: Vec<Array>,
    /// This rank's part of a tensor-parallel model (`shard`; whole by default).
    pub shard: Shard,
}

impl<'a> LoadCtx<'a> {
    pub fn new(weights: &'a mut Weights, quant: Option<&'a Quantization>, dtype: Option<Dtype>) -> Self {
        Self { weights, quant, dtype, loaded: Vec::new(), shard: Shard::whole() }
    }

    /// Evaluates every loaded tensor now (reads, casts, dequantizes), as
    /// mlx-lm's `load` does, so the first request does not pay for it.
    pub fn materialize(&mut self) -> Result<()> {
        mlx_rs::transforms::eval(self.loaded.iter())?;
        self.loaded.clear();
        Ok(())
    }

    fn keep(&mut self, a: &Array) {
        self.loaded.push(a.clone());
    }

    /// Casts a float tensor to the compute dtype, if one was asked for.
    pub fn cast(&self, a: Array) -> Result<Array> {
        match self.dtype {
            Some(dt) if a.dtype() != dt && is_float(a.dtype()) => a.as_dtype(dt),
            _ => Ok(a),
        }
    }

    /// A tensor by name as stored, refused unless its shape is `shape`.
    pub fn take(&mut self, name: &str, shape: &[usize]) -> Result<Array> {
        let a = self.weights.take(name)?;
        expect_shape(name, a.shape(), shape)?;
        Ok(a)
    }

    /// A float tensor by name, refused unless its shape is `shape`, cast to
    /// the compute dtype.
    pub fn tensor(&mut self, name: &str, shape: &[usize]) -> Result<Array> {
        let a = self.take(name, shape)?;
        self.cast(a)
    }

    /// `{path}.weight` of a layer whose weight is `shape` as config.json
    /// implies it (unpacked, when the checkpoint stores it quantized), with
    /// its scales and biases when quantized.
    pub(crate) fn weight(&mut self, path: &str, shape: &[usize]) -> Result<(Array, Option<Quantized>)> {
        let name = format!("{path}.weight");
        let weight = self.weights.take(&name)?;
        let quant = self.quantized(path, &weight)?;
        match &quant {
            None => expect_shape(&name, weight.shape(), shape)?,
            Some(q) => expect_shape(&name, &q.unpacked_shape(&weight), shape).map_err(|e| {
                error(format!("{} ({}-bit quantized, stored as {:?})", e.what(), q.params.bits, weight.shape()))
            })?,
        }
        Ok((weight, quant))
    }

    /// The quantized parts of `path`, when the checkpoint has them.
    pub(crate) fn quantized(&mut self, path: &str, weight: &Array) -> Result<Option<Quantized>> {
        if !self.weights.contains(&format!("{path}.scales")) {
            return Ok(None);
        }
        let params = self
            .quant
            .and_then(|q| q.for_layer(path))
            .ok_or_else(|| error(format!("{path}: has `.scales` but config.json declares no quantization for it")))?;
        let scales = self.weights.take(&format!("{path}.scales"))?;
        let biases = self.weights.take(&format!("{path}.biases"))?;
        check_quantized_shapes(path, weight, &scales, &biases, params)?;
        Ok(Some(Quantized { scales, biases, params }))
    }
}

fn is_float(d: Dtype) -> bool {
    matches!(d, Dtype::Float32 | Dtype::Float16 | Dtype::Bfloat16 | Dtype::Float64)
}

/// Shape checks that keep malformed checkpoints away from MLX's kernels.
fn check_quantized_shapes(path: &str, w: &Array, s: &Array, b: &Array, p: QuantParams) -> Result<()> {
    let (ws, ss) = (w.shape(), s.shape());
    let bad = |why: &str| {
        error(format!("{path}: quantized tensors do not match group_size {} bits {}: {why}", p.group_size, p.bits))
    };
    if w.dtype() != Dtype::Uint32 {
        return Err(bad("packed weight is not uint32"));
    }
    if ws.len() < 2 || ss.len() != ws.len() || b.shape() != ss {
        return Err(bad("ranks or scale/bias shapes differ"));
    }
    let packed = ws[ws.len() - 1] as i64;
    let inputs = packed * 32 / p.bits as i64;
    if inputs % p.group_size as i64 != 0
        || ss[ss.len() - 1] as i64 != inputs / p.group_size as i64
        || ss[..ss.len() - 1] != ws[..ws.len() - 1]
    {
        return Err(bad(&format!("weight {ws:?}, scales {ss:?}")));
    }
    Ok(())
}

pub(crate) struct Quantized {
    pub(crate) scales: Array,
    pub(crate) biases: Array,
    pub(crate) params: QuantParams,
}

impl Quantized {
    /// The shape `w` has once unpacked (its last axis holds `32 / bits`
    /// values per `uint32`).
    pub(crate) fn unpacked_shape(&self, w: &Array) -> Vec<i32> {
        let mut s = w.shape().to_vec();
        if let Some(last) = s.last_mut() {
            *last = *last * 32 / self.params.bits;
        }
        s
    }

    pub(crate) fn dequantize(&self, w: &Array) -> Result<Array> {
        ops::dequantize(w, &self.scales, &self.biases, self.params.group_size, self.params.bits)
    }
}

/// `nn.Linear` / `nn.QuantizedLinear`, whole or as one rank's part of a
/// tensor-parallel pair (`load_column`, `load_row`).
pub struct Linear {
    weight: Array,
    bias: Option<Array>,
    quant: Option<Quantized>,
    /// Row-parallel: the ranks the partial product is summed over, before
    /// the bias (mlx-lm's `ShardedToAllLinear`).
    reduce: Option<Shard>,
}

impl Linear {
    /// `{path}.weight` `[out, inp]` (and `{path}.bias` `[out]` with `bias`),
    /// `out` and `inp` as config.json implies them.
    pub fn load(ctx: &mut LoadCtx, path: &str, out: usize, inp: usize, bias: bool) -> Result<Self> {
        let (weight, quant) = ctx.weight(path, &[out, inp])?;
        let bias = if bias { Some(ctx.tensor(&format!("{path}.bias"), &[out])?) } else { None };
        let layer = match quant {
            // A compute dtype was asked for: run dense (on CPU, f32 with
            // OpenBLAS beats MLX's quantized CPU kernels by far).
            Some(q) if ctx.dtype.is_some() => {
                Self { weight: ctx.cast(q.dequantize(&weight)?)?, bias, quant: None, reduce: None }
            }
            Some(q) => Self { weight, bias, quant: Some(q), reduce: None },
            None => Self { weight: ctx.cast(weight)?, bias, quant: None, reduce: None },
        };
        layer.record(ctx);
        Ok(layer)
    }

    /// Column-parallel (mlx-lm's `AllToShardedLinear`): this rank keeps
    /// `out / ranks` output features (rows of the weight, of its scales and
    /// biases, of the bias). `out` must hold whole heads or channels per
    /// rank; the caller splits its own counts with `ctx.shard.split`.
    pub fn load_column(ctx: &mut LoadCtx, path: &str, out: usize, inp: usize, bias: bool) -> Result<Self> {
        let whole = Self::load_unrecorded(ctx, path, out, inp, bias)?;
        let sh = ctx.shard.clone();
        sh.split(out, &format!("output features of `{path}`"))?;
        let layer = Self {
            weight: sh.take(&whole.weight, 0)?,
            bias: whole.bias.as_ref().map(|b| sh.take(b, 0)).transpose()?,
            quant: match whole.quant {
                Some(q) => {
                    Some(Quantized { scales: sh.take(&q.scales, 0)?, biases: sh.take(&q.biases, 0)?, params: q.params })
                }
                None => None,
            },
            reduce: None,
        };
        layer.record(ctx);
        Ok(layer)
    }

    /// Row-parallel (mlx-lm's `ShardedToAllLinear`): this rank keeps `inp /
    /// ranks` input features (columns of the weight; of a quantized weight,
    /// whole quantization groups) and `forward` sums the partial products
    /// over the ranks before adding the (whole) bias.
    pub fn load_row(ctx: &mut LoadCtx, path: &str, out: usize, inp: usize, bias: bool) -> Result<Self> {
        let whole = Self::load_unrecorded(ctx, path, out, inp, bias)?;
        let sh = ctx.shard.clone();
        let part = sh.split(inp, &format!("input features of `{path}`"))?;
        if sh.size() == 1 {
            whole.record(ctx);
            return Ok(whole);
        }
        let quant = match whole.quant {
            Some(q) => {
                if part % q.params.group_size as usize != 0 {
                    return Err(error(format!(
                        "tensor parallelism over {} ranks: `{path}`'s {part} input features per rank are not whole quantization groups of {}",
                        sh.size(),
                        q.params.group_size
                    )));
                }
                Some(Quantized { scales: sh.take(&q.scales, 1)?, biases: sh.take(&q.biases, 1)?, params: q.params })
            }
            None => None,
        };
        let layer = Self { weight: sh.take(&whole.weight, 1)?, bias: whole.bias, quant, reduce: Some(sh) };
        layer.record(ctx);
        Ok(layer)
    }

    /// `load` without recording the whole tensors for `materialize` (a
    /// sharded layer records its slices instead).
    fn load_unrecorded(ctx: &mut LoadCtx, path: &str, out: usize, inp: usize, bias: bool) -> Result<Self> {
        let mark = ctx.loaded.len();
        let layer = Self::load(ctx, path, out, inp, bias)?;
        ctx.loaded.truncate(mark);
        Ok(layer)
    }

    fn record(&self, ctx: &mut LoadCtx) {
        ctx.keep(&self.weight);
        if let Some(b) = &self.bias {
            ctx.keep(b);
        }
        if let Some(q) = &self.quant {
            ctx.keep(&q.scales);
            ctx.keep(&q.biases);
        }
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        if let Some(shard) = &self.reduce {
            let y = shard.all_sum(&self.product(x)?)?;
            return match &self.bias {
                Some(b) => y.add(b),
                None => Ok(y),
            };
        }
        match &self.quant {
            Some(q) => {
                let y = ops::quantized_matmul(
                    x,
                    &self.weight,
                    &q.scales,
                    &q.biases,
                    true,
                    q.params.group_size,
                    q.params.bits,
                )?;
                match &self.bias {
                    Some(b) => y.add(b),
                    None => Ok(y),
                }
            }
            None => {
                let wt = self.weight.transpose_axes(&[1, 0])?;
                match &self.bias {
                    // MLX's nn.Linear fuses the bias with addmm.
                    Some(b) => ops::addmm(b, x, &wt, None, None),
                    None => x.matmul(&wt),
                }
            }
        }
    }
}

impl Linear {
    /// The weight, when this layer is a plain dense product: not quantized,
    /// no bias, no sum over ranks (what the fused decode kernels read).
    pub(crate) fn dense_weight(&self) -> Option<&Array> {
        (self.quant.is_none() && self.bias.is_none() && self.reduce.is_none()).then_some(&self.weight)
    }

    /// One layer giving `a`'s outputs then `b`'s (their weights stacked by
    /// rows), when both are plain dense products: a fused decode kernel
    /// takes it as one weight. Its rows equal the two layers' own, though
    /// MLX's matmul may sum them in another order; callers use it only where
    /// the fused kernel runs. The stacked weight is evaluated by
    /// `ctx.materialize`.
    pub fn stacked(ctx: &mut LoadCtx, a: &Linear, b: &Linear) -> Result<Option<Linear>> {
        match (a.dense_weight(), b.dense_weight()) {
            (Some(wa), Some(wb)) if wa.dtype() == wb.dtype() => {
                let weight = mlx_rs::ops::concatenate(&[wa, wb], 0)?;
                ctx.loaded.push(weight.clone());
                Ok(Some(Linear { weight, bias: None, quant: None, reduce: None }))
            }
            _ => Ok(None),
        }
    }

    /// Output rows.
    pub fn outputs(&self) -> i32 {
        self.weight.shape()[0]
    }

    /// `x @ W.T` without the bias.
    fn product(&self, x: &Array) -> Result<Array> {
        match &self.quant {
            Some(q) => {
                ops::quantized_matmul(x, &self.weight, &q.scales, &q.biases, true, q.params.group_size, q.params.bits)
            }
            None => x.matmul(self.weight.transpose_axes(&[1, 0])?),
        }
    }
}

/// `nn.Embedding` / `nn.QuantizedEmbedding`, also usable as the tied LM head.
pub struct Embedding {
    weight: Array,
    quant: Option<Quantized>,
}

impl Embedding {
    /// `{path}.weight` `[vocab, dim]`.
    pub fn load(ctx: &mut LoadCtx, path: &str, vocab: usize, dim: usize) -> Result<Self> {
        let (weight, quant) = ctx.weight(path, &[vocab, dim])?;
        let layer = match quant {
            Some(q) if ctx.dtype.is_some() => Self { weight: ctx.cast(q.dequantize(&weight)?)?, quant: None },
            Some(q) => Self { weight, quant: Some(q) },
            None => Self { weight: ctx.cast(weight)?, quant: None },
        };
        ctx.keep(&layer.weight);
        if let Some(q) = &layer.quant {
            ctx.keep(&q.scales);
            ctx.keep(&q.biases);
        }
        Ok(layer)
    }

    pub fn forward(&self, ids: &Array) -> Result<Array> {
        match &self.quant {
            None => self.weight.take_axis(ids, 0),
            Some(q) => {
                let w = self.weight.take_axis(ids, 0)?;
                let s = q.scales.take_axis(ids, 0)?;
                let b = q.biases.take_axis(ids, 0)?;
                ops::dequantize(&w, &s, &b, q.params.group_size, q.params.bits)
            }
        }
    }

    /// The tied LM head: `x @ W.T`.
    pub fn as_linear(&self, x: &Array) -> Result<Array> {
        match &self.quant {
            None => x.matmul(self.weight.transpose_axes(&[1, 0])?),
            Some(q) => {
                ops::quantized_matmul(x, &self.weight, &q.scales, &q.biases, true, q.params.group_size, q.params.bits)
            }
        }
    }

    pub fn vocab_size(&self) -> i32 {
        self.weight.shape()[0]
    }
}

/// `nn.RMSNorm` (the fused kernel).
pub struct RmsNorm {
    weight: Array,
    eps: f32,
}

impl RmsNorm {
    pub fn new(weight: Array, eps: f32) -> Self {
        Self { weight, eps }
    }

    /// `{path}.weight` `[dim]`.
    pub fn load(ctx: &mut LoadCtx, path: &str, dim: usize, eps: f32) -> Result<Self> {
        let weight = ctx.tensor(&format!("{path}.weight"), &[dim])?;
        ctx.keep(&weight);
        Ok(Self { weight, eps })
    }

    /// `load` with mlx-lm's sanitize rule for raw Hugging Face checkpoints
    /// of zero-centred norms (Qwen3.5/Qwen3-Next store `weight - 1`):
    /// `shift` adds 1 to the stored weight, in its stored dtype and before
    /// any cast, as mlx-lm does.
    pub fn load_shifted(ctx: &mut LoadCtx, path: &str, dim: usize, eps: f32, shift: bool) -> Result<Self> {
        let w = ctx.take(&format!("{path}.weight"), &[dim])?;
        let w = if shift { w.add(crate::ops::scalar(1.0, w.dtype())?)? } else { w };
        let weight = ctx.cast(w)?;
        ctx.keep(&weight);
        Ok(Self { weight, eps })
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        mlx_rs::fast::rms_norm(x, Some(&self.weight), self.eps)
    }

    pub(crate) fn parts(&self) -> (&Array, f32) {
        (&self.weight, self.eps)
    }
}
