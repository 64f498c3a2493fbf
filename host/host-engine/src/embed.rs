//! Embeddings: inputs run through the model in padded batches, their final
//! (normed) hidden states pooled as the folder declares (`pooling`), then
//! L2-normalised when its pipeline ends with Normalize. Reached through a
//! whole-input job (`input_job.rs`), which has checked the inputs.

use crate::engine::Engine;
use crate::error::EngineError;
use crate::pooling::PoolingMode;
use crate::tensors::token_array_rows;
use mlx_rs::Array;

/// Most inputs one forward carries (more would only widen the matmuls of a
/// batch of short inputs; the token bound below is what limits memory).
const MAX_ROWS: usize = 64;

impl Engine {
    /// One vector per input, in input order.
    pub fn embed(&self, inputs: &[Vec<u32>]) -> Result<Vec<Vec<f32>>, EngineError> {
        let pooling = self.pooling().clone().map_err(|e| EngineError::InvalidRequest(e.to_string()))?;
        let mut out = vec![Vec::new(); inputs.len()];
        for group in batches(inputs, self.prefill_step()) {
            let rows: Vec<&[u32]> = group.iter().map(|&i| inputs[i].as_slice()).collect();
            for (i, mut v) in group.into_iter().zip(self.pool_rows(&rows, pooling.mode)?) {
                if pooling.normalize {
                    normalize(&mut v);
                }
                out[i] = v;
            }
        }
        Ok(out)
    }

    /// Pooled hidden states of `rows`, run as one batch right-padded to the
    /// longest: attention is causal, so no position sees the padding after
    /// it, and the pooling weights give the padding none. A batch wider than
    /// a prefill chunk runs chunk by chunk over its caches.
    fn pool_rows(&self, rows: &[&[u32]], mode: PoolingMode) -> Result<Vec<Vec<f32>>, EngineError> {
        let width = rows.iter().map(|r| r.len()).max().unwrap_or(0);
        let weights = pooling_weights(rows, width, mode);
        let mut caches = self.model().new_caches(rows.len() as u32)?;
        let step = self.prefill_step();
        let mut pooled: Option<Array> = None;
        for start in (0..width).step_by(step) {
            let end = (start + step).min(width);
            let tokens: Vec<Vec<u32>> = rows.iter().map(|r| padded(r, start, end)).collect();
            let hidden =
                self.forward(&token_array_rows(&tokens), &mut caches, false)?.as_dtype(mlx_rs::Dtype::Float32)?;
            let w: Vec<f32> = weights.iter().flat_map(|row| row[start..end].iter().copied()).collect();
            // [B, 1, chunk] x [B, chunk, H]: each row's weighted sum of its positions.
            let part = Array::from_slice(&w, &[rows.len() as i32, 1, (end - start) as i32]).matmul(&hidden)?;
            let sum = match pooled.take() {
                Some(p) => p.add(&part)?,
                None => part,
            };
            sum.eval()?;
            pooled = Some(sum);
            if width > step {
                crate::runtime::clear_cache();
            }
        }
        let pooled = pooled.ok_or_else(|| EngineError::InvalidRequest("nothing to embed".into()))?;
        let hidden = pooled.shape()[pooled.ndim() - 1] as usize;
        Ok(pooled.as_slice::<f32>().chunks(hidden).map(<[f32]>::to_vec).collect())
    }
}

/// Inputs grouped into batches by length (shortest first, so little is
/// padding), each at most `MAX_ROWS` rows and `rows x width <= step` tokens;
/// an input longer than `step` runs alone.
fn batches(inputs: &[Vec<u32>], step: usize) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..inputs.len()).collect();
    order.sort_by_key(|&i| inputs[i].len());
    let mut out: Vec<Vec<usize>> = Vec::new();
    for i in order {
        let len = inputs[i].len();
        match out.last_mut() {
            Some(g) if g.len() < MAX_ROWS && (g.len() + 1) * len <= step => g.push(i),
            _ => out.push(vec![i]),
        }
    }
    out
}

/// Per row, the weight of each position in its vector.
fn pooling_weights(rows: &[&[u32]], width: usize, mode: PoolingMode) -> Vec<Vec<f32>> {
    rows.iter()
        .map(|r| {
            let mut w = vec![0f32; width];
            match mode {
                PoolingMode::Cls => w[0] = 1.0,
                PoolingMode::LastToken => w[r.len() - 1] = 1.0,
                PoolingMode::Mean => w[..r.len()].fill(1.0 / r.len() as f32),
            }
            w
        })
        .collect()
}

/// Positions `start..end` of a row, padded with id 0 past its end (any id
/// in the vocabulary would do: nothing reads the padding's states).
fn padded(row: &[u32], start: usize, end: usize) -> Vec<u32> {
    (start..end).map(|p| row.get(p).copied().unwrap_or(0)).collect()
}

/// L2 normalisation as sentence-transformers' Normalize: x / max(|x|, 1e-12).
pub fn normalize(v: &mut [f32]) {
    let norm = v.iter().map(|x| (*x as f64) * (*x as f64)).sum::<f64>().sqrt().max(1e-12);
    for x in v.iter_mut() {
        *x = (*x as f64 / norm) as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_keep_to_the_token_bound_and_cover_every_input_once() {
        let inputs: Vec<Vec<u32>> = [5, 300, 1, 5000, 40, 40, 2048].iter().map(|&n| vec![1; n]).collect();
        let groups = batches(&inputs, 2048);
        let mut seen: Vec<usize> = groups.iter().flatten().copied().collect();
        seen.sort();
        assert_eq!(seen, (0..inputs.len()).collect::<Vec<_>>());
        for g in &groups {
            let width = g.iter().map(|&i| inputs[i].len()).max().unwrap();
            assert!(g.len() == 1 || g.len() * width <= 2048, "{g:?}");
        }
        assert!(groups.iter().any(|g| g == &vec![3]), "the long input runs alone: {groups:?}");
    }

    #[test]
    fn weights_pick_the_positions_each_mode_pools() {
        let rows: [&[u32]; 2] = [&[7, 8, 9], &[7]];
        assert_eq!(pooling_weights(&rows, 3, PoolingMode::LastToken), vec![vec![0., 0., 1.], vec![1., 0., 0.]]);
        assert_eq!(pooling_weights(&rows, 3, PoolingMode::Cls), vec![vec![1., 0., 0.], vec![1., 0., 0.]]);
        let mean = pooling_weights(&rows, 3, PoolingMode::Mean);
        assert_eq!(mean[1], vec![1., 0., 0.]);
        assert!(mean[0].iter().all(|w| (w - 1.0 / 3.0).abs() < 1e-7));
    }
}
