//! Prompt scoring: each token of an input under the tokens before it (its
//! logprob and the likeliest alternatives), what completions' `echo` with
//! `logprobs` reports for the prompt. The input runs as a prefill over fresh
//! caches with logits at every position; row i scores token i + 1. Logprobs
//! are the logits' log-softmax in their dtype, as a generated token's are
//! (`Sampler::logprobs`).

use crate::engine::Engine;
use crate::error::EngineError;
use crate::job::TokenOut;
use crate::sampling::{top_logprobs_rows, Sampler};
use crate::tensors::token_array_rows;
use mlx_rs::ops::indexing::take_along_axis;
use mlx_rs::Array;

/// Positions per forward: bounds the `[chunk, V]` logits a long input
/// holds at once (a 150k vocabulary at 256 rows is 150 MB of float32).
const CHUNK: usize = 256;

impl Engine {
    /// Per input, one entry per token: the first without a logprob (nothing
    /// comes before it), each other with its logprob and `top` alternatives.
    pub fn score(&self, inputs: &[Vec<u32>], top: usize) -> Result<Vec<Vec<TokenOut>>, EngineError> {
        inputs.iter().map(|ids| self.score_one(ids, top)).collect()
    }

    fn score_one(&self, ids: &[u32], top: usize) -> Result<Vec<TokenOut>, EngineError> {
        let mut out = Vec::with_capacity(ids.len());
        out.push(TokenOut { id: ids[0], logprob: None, top: Vec::new() });
        let mut caches = self.model().new_caches(1)?;
        let step = CHUNK.min(self.prefill_step());
        // The last token is scored, never run: nothing follows it.
        let run = &ids[..ids.len() - 1];
        for (c, chunk) in run.chunks(step).enumerate() {
            let next = &ids[c * step + 1..c * step + 1 + chunk.len()];
            let logits = self.forward_all(&token_array_rows(&[chunk.to_vec()]), &mut caches)?;
            let lp = Sampler::logprobs(&logits)?;
            let wanted: Vec<i32> = next.iter().map(|&t| t as i32).collect();
            let wanted = Array::from_slice(&wanted, &[next.len() as i32, 1]);
            let chosen = take_along_axis(&lp, &wanted, -1)?.as_dtype(mlx_rs::Dtype::Float32)?;
            let tops = top_logprobs_rows(&lp, top)?;
            chosen.eval()?;
            for ((&id, &logprob), top) in next.iter().zip(chosen.as_slice::<f32>()).zip(tops) {
                out.push(TokenOut { id, logprob: Some(logprob), top });
            }
        }
        Ok(out)
    }
}
