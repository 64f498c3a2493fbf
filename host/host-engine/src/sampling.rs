//! Sampling on the device, in mlx-lm's order: logits processors
//! (repetition, presence, frequency penalties) on logits; log-probabilities
//! `logits - logsumexp(logits)` in the model's dtype; then greedy argmax, or
//! top-p → min-p → top-k filters and a categorical draw at `1/temperature`.
//! Only the chosen id (and requested logprobs) is read back.

use mlx_rs::ops::indexing::{argmax_axis, take_along_axis};
use mlx_rs::{ops, random, Array};

type R<T> = Result<T, mlx_rs::error::Exception>;

#[derive(serde::Serialize, serde::Deserialize, Debug, Clone)]
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
    /// Added to these tokens' logits before anything else (OpenAI's
    /// `logit_bias`; -100 bans a token, +100 all but forces it).
    pub logit_bias: Vec<(u32, f32)>,
    /// Draws the request's key chain made before its generation was resumed
    /// in another engine process: the chain continues from there.
    #[serde(default)]
    pub resume_draws: u64,
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
            logit_bias: Vec::new(),
            resume_draws: 0,
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

    /// Range checks, naming the parameter (the server maps them to 400s).
    pub fn validate(&self) -> Result<(), ParamError> {
        let bad = |param: &'static str, v: f32, range: &str| {
            Err(ParamError { param, message: format!("`{param}` must be {range}, got {v}") })
        };
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
        if let Some(&(_, b)) = self.logit_bias.iter().find(|(_, b)| !(-100.0..=100.0).contains(b)) {
            return bad("logit_bias", b, "between -100 and 100 for every token");
        }
        Ok(())
    }
}

/// A sampling parameter out of its range.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct ParamError {
    pub param: &'static str,
    pub message: String,
}

/// One request's sampler: parameters plus its own PRNG key chain.
pub struct Sampler {
    pub params: SamplingParams,
    key: Option<Array>,
    /// The chain's seed (0 when greedy): drafters' seeds derive from it.
    seed: u64,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> R<Self> {
        if params.is_greedy() {
            return Ok(Self { params, key: None, seed: 0 });
        }
        let seed = params.seed.unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
        });
        let mut key = random::key(seed)?;
        for _ in 0..params.resume_draws {
            key = random::split(&key, 2)?.0;
        }
        Ok(Self { params, key: Some(key), seed })
    }

    /// Applies the logit bias, then the penalties, to `[1, V]` logits
    /// given the token history (mlx-lm's logits processors, in its order).
    pub fn process(&self, logits: Array, history: &[u32]) -> R<Array> {
        self.penalize(self.bias(logits)?, history)
    }

    /// Applies the penalties to `[1, V]` logits given the token history.
    pub fn penalize(&self, logits: Array, history: &[u32]) -> R<Array> {
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

    /// `logits` with the request's logit bias added (each row alike).
    pub fn bias(&self, logits: Array) -> R<Array> {
        let bias = &self.params.logit_bias;
        if bias.is_empty() {
            return Ok(logits);
        }
        let v = logits.shape()[logits.ndim() - 1];
        let mut dense = vec![0f32; v as usize];
        for &(id, b) in bias {
            if let Some(slot) = dense.get_mut(id as usize) {
                *slot += b;
            }
        }
        logits.add(Array::from_slice(&dense, &[v]).as_dtype(logits.dtype())?)
    }

    /// `logits` (`[..., V]`) with every token that `words` (bit words,
    /// `ceil(V/32)` per row of logits: bit `id % 32` of word `id / 32`)
    /// rules out set to -inf: a grammar's allowed tokens. On a GPU the words
    /// go to the device and are unpacked there (32 times fewer bytes than a
    /// flag per token); on the CPU, where nothing travels, they are expanded
    /// here, which is cheaper than MLX's CPU kernels doing it.
    pub fn constrain(logits: &Array, words: &[u32]) -> R<Array> {
        let shape = logits.shape().to_vec();
        let v = *shape.last().expect("logits have a vocabulary axis");
        let n = (v as usize).div_ceil(32);
        let on = match crate::runtime::default_device() {
            crate::runtime::DeviceKind::Cpu => {
                let flags: Vec<bool> = words
                    .chunks(n)
                    .flat_map(|row| (0..v as usize).map(move |id| row[id / 32] >> (id % 32) & 1 == 1))
                    .collect();
                Array::from_slice(&flags, &shape)
            }
            crate::runtime::DeviceKind::Gpu => {
                let mut words_shape = shape.clone();
                *words_shape.last_mut().expect("checked above") = n as i32;
                let words = Array::from_slice(words, &words_shape);
                let ids = ops::arange::<_, u32>(0, v, None)?;
                let thirty_two = Array::from_slice(&[32u32], &[1]);
                let word = ops::indexing::take_axis(&words, ops::floor_divide(&ids, &thirty_two)?, -1)?;
                let bit = Array::from_slice(&[2u32], &[1]).power(ops::remainder(&ids, &thirty_two)?)?;
                ops::remainder(ops::floor_divide(&word, &bit)?, Array::from_slice(&[2u32], &[1]))?
                    .eq(Array::from_slice(&[1u32], &[1]))?
            }
        };
        let low = Array::from_f32(f32::NEG_INFINITY).as_dtype(logits.dtype())?;
        ops::select(&on, logits, &low)
    }

    /// `logits - logsumexp(logits)` in the logits' dtype (as mlx-lm).
    pub fn logprobs(logits: &Array) -> R<Array> {
        logits.subtract(logits.logsumexp_axis(-1, true)?)
    }

    /// Draws the next token id (`[1]`, uint32/int32) from `[1, V]` logprobs.
    pub fn sample(&mut self, logprobs: &Array) -> R<Array> {
        if self.params.is_greedy() {
            return argmax_axis(logprobs, -1, None);
        }
        let lp = self.filter(logprobs)?;
        let key = self.next_key()?;
        random::categorical(self.scale(&lp)?, -1, None, &key)
    }

    /// The normalised distribution `sample` draws from, float32, for each
    /// row of `[N, V]` logprobs (temperature > 0): the filtered, scaled
    /// logprobs through a softmax. Rejection sampling compares it with a
    /// drafter's.
    pub fn probabilities(&self, logprobs: &Array) -> R<Array> {
        let scaled = self.scale(&self.filter(logprobs)?)?;
        ops::softmax_axis(scaled.as_dtype(mlx_rs::Dtype::Float32)?, -1, true)
    }

    /// `n` uniforms in [0, 1) from the request's key chain (float32 `[n]`).
    pub fn uniforms(&mut self, n: i32) -> R<Array> {
        let key = self.next_key()?;
        random::uniform::<_, f32>(0.0f32, 1.0f32, &[n], &key)
    }

    /// One draw per row of non-negative, not necessarily normalised,
    /// weights `[N, V]` (`[N]`), from the request's key chain.
    pub fn draw(&mut self, weights: &Array) -> R<Array> {
        let key = self.next_key()?;
        random::categorical(weights.log()?, -1, None, &key)
    }

    /// A seed for a drafter's own draws at `position` of the sequence:
    /// fixed by the request's seed, different at every position, and not a
    /// key of this chain (drafts must be independent of the accept draws).
    pub fn draft_seed(&self, position: u64) -> u64 {
        splitmix64(self.seed ^ splitmix64(position.wrapping_add(0x5eed)))
    }

    fn next_key(&mut self) -> R<Array> {
        let key = self.key.take().expect("a sampling key at temperature > 0");
        let (next, sub) = random::split(&key, 2)?;
        self.key = Some(next);
        Ok(sub)
    }

    /// `logprobs * (1/temperature)`, in the logprobs' dtype.
    fn scale(&self, lp: &Array) -> R<Array> {
        lp.multiply(Array::from_f32(1.0 / self.params.temperature))
    }

    /// top-p → min-p → top-k over each row of `[N, V]` logprobs: filtered
    /// entries become -inf.
    fn filter(&self, logprobs: &Array) -> R<Array> {
        let p = &self.params;
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
        Ok(lp)
    }
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `a[:, start:stop]` on `[N, V]` rows.
fn model_slice(a: &Array, start: i32, stop: i32) -> R<Array> {
    use mlx_rs::ops::indexing::IndexOp;
    Ok(a.index((.., start..stop)))
}

/// The `k` most likely (id, logprob) of a `[1, V]` row, best first.
pub fn top_logprobs(logprobs: &Array, k: usize) -> R<Vec<(u32, f32)>> {
    Ok(top_logprobs_rows(logprobs, k)?.into_iter().next().unwrap_or_default())
}

/// The `k` most likely (id, logprob) of each row of `[N, V]` logprobs,
/// best first (ties: the lower id first).
pub fn top_logprobs_rows(logprobs: &Array, k: usize) -> R<Vec<Vec<(u32, f32)>>> {
    let n = logprobs.shape()[0] as usize;
    if k == 0 {
        return Ok(vec![Vec::new(); n]);
    }
    let v = logprobs.shape()[1] as usize;
    let k = k.min(v);
    let part = ops::argpartition_axis(&logprobs.negative()?, (k - 1) as i32, -1)?;
    let idx = model_slice(&part, 0, k as i32)?;
    let vals = take_along_axis(logprobs, &idx, -1)?.as_dtype(mlx_rs::Dtype::Float32)?;
    let idx = idx.as_dtype(mlx_rs::Dtype::Int32)?;
    mlx_rs::transforms::eval([&idx, &vals])?;
    let rows = idx.as_slice::<i32>().chunks(k).zip(vals.as_slice::<f32>().chunks(k));
    Ok(rows
        .map(|(ids, lps)| {
            let mut out: Vec<(u32, f32)> = ids.iter().zip(lps).map(|(&i, &x)| (i as u32, x)).collect();
            out.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            out
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probs(params: SamplingParams) -> Vec<f32> {
        let lp = Array::from_slice(&[0.5f32, 0.25, 0.15, 0.1], &[1, 4]).log().unwrap();
        let p = Sampler::new(SamplingParams { seed: Some(1), ..params }).unwrap().probabilities(&lp).unwrap();
        p.eval().unwrap();
        p.as_slice::<f32>().to_vec()
    }

    fn close(a: &[f32], b: &[f32]) -> bool {
        a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-5)
    }

    #[test]
    fn probabilities_are_what_sample_draws_from() {
        let t1 = SamplingParams { temperature: 1.0, ..Default::default() };
        assert!(close(&probs(t1.clone()), &[0.5, 0.25, 0.15, 0.1]));
        let two_thirds = [2.0 / 3.0, 1.0 / 3.0, 0.0, 0.0];
        assert!(close(&probs(SamplingParams { top_k: 2, ..t1.clone() }), &two_thirds));
        assert!(close(&probs(SamplingParams { top_p: 0.7, ..t1.clone() }), &two_thirds));
        assert!(close(&probs(SamplingParams { min_p: 0.4, ..t1.clone() }), &two_thirds));
        // Temperature 2: proportional to sqrt(p).
        let r: Vec<f32> = [0.5f32, 0.25, 0.15, 0.1].iter().map(|p| p.sqrt()).collect();
        let sum: f32 = r.iter().sum();
        assert!(close(
            &probs(SamplingParams { temperature: 2.0, ..t1 }),
            &r.iter().map(|x| x / sum).collect::<Vec<_>>()
        ));
    }
}
