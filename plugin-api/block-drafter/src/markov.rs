//! DSpark's heads over the block's output.
//! - Vanilla Markov head (mlx-vlm `VanillaMarkov`): a low-rank transition
//!   correction `logits_k += w2(w1[previous token])`, so drafts are chosen
//!   one after another, each seeing the token before it (the anchor for the
//!   first).
//! - Confidence head (`DSparkConfidenceHead`): `sigmoid(proj([hidden_k,
//!   w1[previous token]]))`, the drafter's estimate that draft k survives;
//!   mlx-vlm loads it and never uses it; here it prunes a round at the first
//!   draft whose confidence falls under its position's threshold.

use model_kit::layers::{Embedding, Linear, LoadCtx};
use model_kit::{Array, Result};
use plugin_sdk::mlx_rs::ops;

pub struct Markov {
    w1: Embedding,
    w2: Linear,
}

impl Markov {
    pub fn load(ctx: &mut LoadCtx, vocab: usize, rank: usize) -> Result<Self> {
        Ok(Self {
            w1: Embedding::load(ctx, "markov_head.markov_w1", vocab, rank)?,
            w2: Linear::load(ctx, "markov_head.markov_w2", vocab, rank, false)?,
        })
    }

    /// `w1[previous]` `[1, rank]` for one int32 token.
    pub fn embed(&self, previous: &Array) -> Result<Array> {
        self.w1.forward(previous)
    }

    /// One draft step's logits `[1, V]` corrected by the previous token
    /// (int `[1]`, on the device: the chain needs no host round trip).
    pub fn step(&self, logits: &Array, previous: &Array) -> Result<Array> {
        let e = self.embed(previous)?;
        logits.add(&self.w2.forward(&e)?.reshape(&[1, -1])?)
    }
}

pub struct Confidence {
    proj: Linear,
    with_markov: bool,
}

impl Confidence {
    pub fn load(ctx: &mut LoadCtx, hidden: usize, rank: usize, with_markov: bool) -> Result<Self> {
        let inp = if with_markov { hidden + rank } else { hidden };
        Ok(Self { proj: Linear::load(ctx, "confidence_head.proj", 1, inp, true)?, with_markov })
    }

    /// Confidences `[K]` (float32) of drafts whose block outputs are
    /// `hidden` `[K, H]` and whose previous tokens are `previous` `[K]`.
    pub fn forward(&self, hidden: &Array, previous: &[u32], markov: Option<&Markov>) -> Result<Array> {
        let features = match (self.with_markov, markov) {
            (true, Some(m)) => {
                let ids: Vec<i32> = previous.iter().map(|&t| t as i32).collect();
                let e = m.embed(&Array::from_slice(&ids, &[ids.len() as i32]))?;
                ops::concatenate(&[hidden.clone(), e.as_dtype(hidden.dtype())?], -1)?
            }
            _ => hidden.clone(),
        };
        ops::sigmoid(&self.proj.forward(&features)?.reshape(&[-1])?.as_dtype(model_kit::Dtype::Float32)?)
    }
}
