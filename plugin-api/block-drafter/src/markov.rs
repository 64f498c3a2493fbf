//! DSpark's heads over the block's output.
//! - Markov heads, speculators' three (`markov_head_type`): a low-rank
//!   transition correction of each draft's logits by the token before it
//!   (the anchor for the first), so drafts are chosen one after another:
//!   - vanilla (also mlx-vlm's `VanillaMarkov`): `logits_k += w2(e)`, `e =
//!     w1[previous token]`;
//!   - gated: `logits_k += w2(sigmoid(gate_proj([h_k, e])) * e)`, `h_k` the
//!     block's output at the draft's slot;
//!   - rnn: a state `s` (zero at each block) with `[g, c, o] =
//!     joint_proj([s, e, h_k])`, `s = σ(g) s + (1 − σ(g)) tanh(c)`,
//!     `logits_k += w2(tanh(o))`.
//! - Confidence head (`DSparkConfidenceHead`): `sigmoid(proj([hidden_k,
//!   w1[previous token]]))`, the drafter's estimate that draft k survives;
//!   mlx-vlm loads it and never uses it; here it prunes a round at the first
//!   draft whose confidence falls under its position's threshold.

use crate::config::MarkovKind;
use model_kit::layers::{Embedding, Linear, LoadCtx};
use model_kit::{Array, Result};
use plugin_sdk::mlx_rs::ops;

enum Mix {
    Vanilla,
    Gated(Linear),
    Rnn(Linear),
}

pub struct Markov {
    w1: Embedding,
    w2: Linear,
    mix: Mix,
}

impl Markov {
    /// `vocab`: the verifier's (`markov_w1` reads the previous token);
    /// `out`: the logits' (the draft vocabulary, `markov_w2`).
    pub fn load(
        ctx: &mut LoadCtx,
        kind: MarkovKind,
        vocab: usize,
        out: usize,
        rank: usize,
        hidden: usize,
    ) -> Result<Self> {
        let mix = match kind {
            MarkovKind::Vanilla => Mix::Vanilla,
            MarkovKind::Gated => Mix::Gated(Linear::load(ctx, "markov_head.gate_proj", rank, hidden + rank, true)?),
            MarkovKind::Rnn => {
                Mix::Rnn(Linear::load(ctx, "markov_head.joint_proj", 3 * rank, 2 * rank + hidden, true)?)
            }
        };
        Ok(Self {
            w1: Embedding::load(ctx, "markov_head.markov_w1", vocab, rank)?,
            w2: Linear::load(ctx, "markov_head.markov_w2", out, rank, false)?,
            mix,
        })
    }

    /// `w1[previous]` `[1, rank]` for one int32 token.
    pub fn embed(&self, previous: &Array) -> Result<Array> {
        self.w1.forward(previous)
    }

    /// One draft step's logits `[1, V]` corrected by the previous token
    /// (int `[1]`, on the device: the chain needs no host round trip) and,
    /// for the gated and rnn heads, the block's output `hidden` `[1, H]` at
    /// the draft's slot; `state` is the rnn head's, `None` at a block's start.
    pub fn step(&self, logits: &Array, previous: &Array, hidden: &Array, state: &mut Option<Array>) -> Result<Array> {
        let e = self.embed(previous)?.reshape(&[1, -1])?;
        let latent = match &self.mix {
            Mix::Vanilla => e,
            Mix::Gated(gate) => {
                let g = ops::sigmoid(
                    &gate.forward(&ops::concatenate(&[hidden.clone(), e.as_dtype(hidden.dtype())?], -1)?)?,
                )?;
                g.as_dtype(e.dtype())?.multiply(&e)?
            }
            Mix::Rnn(joint) => {
                let s = match state.take() {
                    Some(s) => s,
                    None => ops::zeros_like(&e)?.as_dtype(hidden.dtype())?,
                };
                let z = ops::concatenate(&[s.clone(), e.as_dtype(hidden.dtype())?, hidden.clone()], -1)?;
                let parts = ops::split_equal(&joint.forward(&z)?, 3, -1)?;
                let gate = ops::sigmoid(&parts[0])?;
                let one = Array::from_f32(1.0).as_dtype(gate.dtype())?;
                *state = Some(gate.multiply(&s)?.add(&one.subtract(&gate)?.multiply(&ops::tanh(&parts[1])?)?)?);
                ops::tanh(&parts[2])?
            }
        };
        logits.add(&self.w2.forward(&latent)?.reshape(&[1, -1])?.as_dtype(logits.dtype())?)
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
