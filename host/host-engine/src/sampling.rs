//! Sampling on the device, in mlx-lm's order: logits processors
//! (repetition, presence, frequency penalties) on logits; log-probabilities
//! `logits - logsumexp(logits)` in the model's dtype; then greedy argmax, or
//! top-p → min-p → top-k filters and a categorical draw at `1/temperature`.
//! Only the chosen id (and requested logprobs) is read back.

use mlx_rs::ops::indexing::{argmax_axis, take_along_axis};
use mlx_rs::{ops, random, Array};

type R<T> = Result<T, mlx_rs::error::Exception>;

#[derive(Debug, Clone)]
pub struct SamplingParams {
    /// 0 = greedy.
    pub temperature: f32,
    /// In (0, 1) to filter; 1 (or 0) = off.
    pub top_p: f32,
    /// 0 = off.
    pub top_k: u32,
    /// 0 = off.
    pub min_p: f32,
    /// 1 = off. Sign-aware multiplicative, over the last `penalty_context` tokens.
    pub repetition_penalty: f32,
    /// 0 = off. Subtracted once from each token present in the context.
    pub presence_penalty: f32,
    /// 0 = off. Subtracted once per occurrence in the context.
    pub frequency_penalty: f32,
    /// Tokens (prompt + generated) the penalties look at (mlx-lm: 20).
    pub penalty_context: usize,
    /// Reproducible draws: the same seed gives the same tokens.
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            penalty_context: 20,
            seed: None,
        }
    }
}

impl SamplingParams {
    pub fn has_penalties(&self) -> bool {
        self.repetition_penalty != 1.0 || self.presence_penalty != 0.0 || self.frequency_penalty != 0.0
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }

    /// Range checks, as clear messages (the server maps them to 400s).
    pub fn validate(&self) -> Result<(), String> {
        let bad = |name: &str, v: f32, range: &str| Err(format!("`{name}` must be {range}, got {v}"));
        if !(0.0..=100.0).contains(&self.temperature) || self.temperature.is_nan() {
            return bad("temperature", self.temperature, "between 0 and 100");
        }
        if !(0.0..=1.0).contains(&self.top_p) || self.top_p.is_nan() {
            return bad("top_p", self.top_p, "between 0 and 1");
        }
        if !(0.0..=1.0).contains(&self.min_p) || self.min_p.is_nan() {
            return bad("min_p", self.min_p, "between 0 and 1");
        }
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty <= 100.0) {
            return bad("repetition_penalty", self.repetition_penalty, "in (0, 100]");
        }
        if !(-2.0..=2.0).contains(&self.presence_penalty) || self.presence_penalty.is_nan() {
            return bad("presence_penalty", self.presence_penalty, "between -2 and 2");
        }
        if !(-2.0..=2.0).contains(&self.frequency_penalty) || self.frequency_penalty.is_nan() {
            return bad("frequency_penalty", self.frequency_penalty, "between -2 and 2");
        }
        Ok(())
    }
}

/// One request's sampler: parameters plus its own PRNG key chain.
pub struct Sampler {
    pub params: SamplingParams,
    key: Option<Array>,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> R<Self> {
        let key = if params.is_greedy() {
            None
        } else {
            let seed = params.seed.unwrap_or_else(|| {
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
            });
            Some(random::key(seed)?)
        };
        Ok(Self { params, key })
    }

    /// Applies the penalties to `[1, V]` logits given the token history.
    pub fn process(&self, logits: Array, history: &[u32]) -> R<Array> {
        let p = &self.params;
        if !p.has_penalties() || history.is_empty() {
            return Ok(logits);
        }
        let ctx = &history[history.len().saturating_sub(p.penalty_context)..];
        let mut logits = logits;
        let idx = |ids: &[u32]| {
            let v: Vec<i32> = ids.iter().map(|&t| t as i32).collect();
            Array::from_slice(&v, &[1, v.len() as i32])
        };
        if p.repetition_penalty != 1.0 {
            let i = idx(ctx);
            let sel = take_along_axis(&logits, &i, -1)?;
            let pen = Array::from_f32(p.repetition_penalty).as_dtype(logits.dtype())?;
            let sel = ops::select(&sel.lt(Array::from_f32(0.0))?, sel.multiply(&pen)?, sel.divide(&pen)?)?;
            logits = ops::indexing::put_along_axis(&logits, &i, &sel, -1)?;
        }
        if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
            // Count occurrences on the host: presence subtracts once per
            // distinct token, frequency once per occurrence.
            let mut counts: Vec<(u32, f32)> = Vec::new();
            for &t in ctx {
                match counts.iter_mut().find(|(id, _)| *id == t) {
                    Some((_, c)) => *c += 1.0,
                    None => counts.push((t, 1.0)),
                }
            }
            let ids: Vec<u32> = counts.iter().map(|(t, _)| *t).collect();
            let sub: Vec<f32> = counts.iter().map(|(_, c)| p.presence_penalty + p.frequency_penalty * c).collect();
            let i = idx(&ids);
            let sel = take_along_axis(&logits, &i, -1)?;
            let sub = Array::from_slice(&sub, &[1, sub.len() as i32]).as_dtype(logits.dtype())?;
            logits = ops::indexing::put_along_axis(&logits, &i, &sel.subtract(&sub)?, -1)?;
        }
        Ok(logits)
    }

    /// `logits - logsumexp(logits)` in the logits' dtype (as mlx-lm).
    pub fn logprobs(logits: &Array) -> R<Array> {
        logits.subtract(logits.logsumexp_axis(-1, true)?)
    }

    /// Draws the next token id (`[1]`, uint32/int32) from `[1, V]` logprobs.
    pub fn sample(&mut self, logprobs: &Array) -> R<Array> {
        let p = self.params.clone();
        if p.is_greedy() {
            return argmax_axis(logprobs, -1, None);
        }
        let mut lp = logprobs.clone();
        let neg_inf = || Array::from_f32(f32::NEG_INFINITY);
        if p.top_p > 0.0 && p.top_p < 1.0 {
            let sorted = ops::sort_axis(&lp, -1)?;
            let probs = sorted.as_dtype(mlx_rs::Dtype::Float32)?.exp()?;
            let mass_above = ops::cumsum(&probs, -1, true, false)?;
            let v = probs.shape()[1];
            let first = model_slice(&probs, 0, 1)?;
            let total = model_slice(&mass_above, 0, 1)?.add(&first)?;
            let dropped = mass_above.ge(total.multiply(Array::from_f32(p.top_p))?)?.sum_axis(-1, true)?;
            let dropped = ops::minimum(&dropped, Array::from_int(v - 1))?;
            let threshold = take_along_axis(&sorted, &dropped, -1)?;
            lp = ops::select(&lp.lt(&threshold)?, neg_inf(), &lp)?;
        }
        if p.min_p > 0.0 {
            let top = lp.max_axis(-1, true)?;
            let scaled = top.add(Array::from_f32(p.min_p.ln()))?;
            lp = ops::select(&lp.lt(&scaled)?, neg_inf(), &lp)?;
        }
        let vocab = lp.shape()[1] as u32;
        if p.top_k > 0 && p.top_k < vocab {
            let k = p.top_k as i32;
            let part = ops::argpartition_axis(&lp.negative()?, k - 1, -1)?;
            let mask_idx = model_slice(&part, k, vocab as i32)?;
            let fill = ops::full::<f32>(mask_idx.shape(), neg_inf())?.as_dtype(lp.dtype())?;
            lp = ops::indexing::put_along_axis(&lp, &mask_idx, &fill, -1)?;
        }
        let key = self.key.take().expect("a sampling key at temperature > 0");
        let (next, sub) = random::split(&key, 2)?;
        self.key = Some(next);
        let scaled = lp.multiply(Array::from_f32(1.0 / p.temperature))?;
        random::categorical(&scaled, -1, None, &sub)
    }
}

/// `a[:, start:stop]` on a `[1, V]` row.
fn model_slice(a: &Array, start: i32, stop: i32) -> R<Array> {
    use mlx_rs::ops::indexing::IndexOp;
    Ok(a.index((.., start..stop)))
}

/// The `k` most likely (id, logprob) of a `[1, V]` row, best first.
pub fn top_logprobs(logprobs: &Array, k: usize) -> R<Vec<(u32, f32)>> {
    if k == 0 {
        return Ok(Vec::new());
    }
    let v = logprobs.shape()[1] as usize;
    let k = k.min(v);
    let part = ops::argpartition_axis(&logprobs.negative()?, (k - 1) as i32, -1)?;
    let idx = model_slice(&part, 0, k as i32)?;
    let vals = take_along_axis(logprobs, &idx, -1)?.as_dtype(mlx_rs::Dtype::Float32)?;
    let idx = idx.as_dtype(mlx_rs::Dtype::Int32)?;
    mlx_rs::transforms::eval([&idx, &vals])?;
    let mut out: Vec<(u32, f32)> = idx.as_slice::<i32>().iter().zip(vals.as_slice::<f32>()).map(|(&i, &x)| (i as u32, x)).collect();
    out.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    Ok(out)
}
