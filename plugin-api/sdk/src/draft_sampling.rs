//! Choosing draft tokens from a drafter's logits the way the host samples
//! the target's (a drafter cannot use host crates): greedy argmax
//! at temperature 0; otherwise log-probabilities filtered by top-p, then
//! min-p, then top-k, scaled by 1/temperature, and a draw from the
//! resulting distribution q, whose rows the host needs for rejection
//! sampling. The closer q is to the target's p, the more is accepted; the
//! draws only have to come from the q that is returned.

use mlx_rs::ops::indexing::{argmax_axis, put_along_axis, take_along_axis, IndexOp};
use mlx_rs::{ops, random, Array, Dtype};
use plugin_api::DraftSampling;

type R<T> = Result<T, mlx_rs::error::Exception>;

/// One round's chooser: its key chain and the q rows it drew from.
pub struct Picker {
    s: DraftSampling,
    key: Option<Array>,
    rows: Vec<Array>,
}

impl Picker {
    pub fn new(s: DraftSampling) -> R<Self> {
        let key = if s.is_greedy() { None } else { Some(random::key(s.seed)?) };
        Ok(Self { s, key, rows: Vec::new() })
    }

    /// The next draft token (`[1]`, lazy) from `[1, V]` logits.
    pub fn pick(&mut self, logits: &Array) -> R<Array> {
        let Some(key) = self.key.take() else { return argmax_axis(logits, -1, None) };
        let (next, sub) = random::split(&key, 2)?;
        self.key = Some(next);
        let q = distribution(logits, &self.s)?;
        let token = random::categorical(q.log()?, -1, None, &sub)?;
        self.rows.push(q);
        Ok(token)
    }

    /// float32 `[n, V]`: row i is the q that token i was drawn from (None
    /// when greedy).
    pub fn probabilities(self) -> R<Option<Array>> {
        if self.rows.is_empty() {
            return Ok(None);
        }
        ops::concatenate(&self.rows, 0).map(Some)
    }
}

/// q for `[1, V]` logits: the host's processing (`Sampler::probabilities`).
fn distribution(logits: &Array, s: &DraftSampling) -> R<Array> {
    let neg_inf = || Array::from_f32(f32::NEG_INFINITY);
    let mut lp = logits.subtract(logits.logsumexp_axis(-1, true)?)?;
    let v = lp.shape()[1];
    if s.top_p > 0.0 && s.top_p < 1.0 {
        let sorted = ops::sort_axis(&lp, -1)?;
        let probs = sorted.as_dtype(Dtype::Float32)?.exp()?;
        let mass_above = ops::cumsum(&probs, -1, true, false)?;
        let total = mass_above.index((.., 0..1)).add(probs.index((.., 0..1)))?;
        let dropped = mass_above.ge(total.multiply(Array::from_f32(s.top_p))?)?.sum_axis(-1, true)?;
        let threshold = take_along_axis(&sorted, &ops::minimum(&dropped, Array::from_int(v - 1))?, -1)?;
        lp = ops::select(&lp.lt(&threshold)?, neg_inf(), &lp)?;
    }
    if s.min_p > 0.0 {
        let floor = lp.max_axis(-1, true)?.add(Array::from_f32(s.min_p.ln()))?;
        lp = ops::select(&lp.lt(&floor)?, neg_inf(), &lp)?;
    }
    if s.top_k > 0 && (s.top_k as i32) < v {
        let k = s.top_k as i32;
        let dropped = ops::argpartition_axis(&lp.negative()?, k - 1, -1)?.index((.., k..v));
        let fill = ops::full::<f32>(dropped.shape(), neg_inf())?.as_dtype(lp.dtype())?;
        lp = put_along_axis(&lp, &dropped, &fill, -1)?;
    }
    let scaled = lp.multiply(Array::from_f32(1.0 / s.temperature))?;
    ops::softmax_axis(scaled.as_dtype(Dtype::Float32)?, -1, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampling(temperature: f32) -> DraftSampling {
        DraftSampling { temperature, seed: 9, ..DraftSampling::GREEDY }
    }

    fn q(s: DraftSampling) -> Vec<f32> {
        let logits =
            Array::from_slice(&[0.5f32, 0.25, 0.15, 0.1], &[1, 4]).log().unwrap().add(Array::from_f32(3.0)).unwrap();
        let q = distribution(&logits, &s).unwrap();
        q.eval().unwrap();
        q.as_slice::<f32>().to_vec()
    }

    fn close(a: &[f32], b: &[f32]) -> bool {
        a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-5)
    }

    /// The same cases as the host's `probabilities_are_what_sample_draws_from`.
    #[test]
    fn q_is_the_hosts_processed_distribution() {
        let t1 = sampling(1.0);
        assert!(close(&q(t1), &[0.5, 0.25, 0.15, 0.1]));
        let two_thirds = [2.0 / 3.0, 1.0 / 3.0, 0.0, 0.0];
        assert!(close(&q(DraftSampling { top_k: 2, ..t1 }), &two_thirds));
        assert!(close(&q(DraftSampling { top_p: 0.7, ..t1 }), &two_thirds));
        assert!(close(&q(DraftSampling { min_p: 0.4, ..t1 }), &two_thirds));
        let r: Vec<f32> = [0.5f32, 0.25, 0.15, 0.1].iter().map(|p| p.sqrt()).collect();
        let sum: f32 = r.iter().sum();
        assert!(close(&q(sampling(2.0)), &r.iter().map(|x| x / sum).collect::<Vec<_>>()));
    }

    #[test]
    fn greedy_picks_the_argmax_and_sampled_picks_return_their_rows() {
        let logits = Array::from_slice(&[0.0f32, 5.0, 1.0, -2.0], &[1, 4]);
        let mut greedy = Picker::new(DraftSampling::GREEDY).unwrap();
        assert_eq!(greedy.pick(&logits).unwrap().as_dtype(Dtype::Uint32).unwrap().as_slice::<u32>(), [1]);
        assert!(greedy.probabilities().unwrap().is_none());
        let mut sampled = Picker::new(DraftSampling { top_k: 2, ..sampling(1.0) }).unwrap();
        let picks: Vec<u32> = (0..3)
            .map(|_| sampled.pick(&logits).unwrap().as_dtype(Dtype::Uint32).unwrap().as_slice::<u32>()[0])
            .collect();
        let rows = sampled.probabilities().unwrap().unwrap();
        assert_eq!(rows.shape(), [3, 4]);
        let rows = rows.as_slice::<f32>();
        for (i, &t) in picks.iter().enumerate() {
            assert!(t == 1 || t == 2, "top_k 2 draws from {{1, 2}}: {picks:?}");
            assert!(rows[i * 4 + t as usize] > 0.0 && (rows[i * 4..i * 4 + 4].iter().sum::<f32>() - 1.0).abs() < 1e-5);
        }
    }
}
