//! One verify of a speculative round, queued on the device: the target's
//! forward over the pending token and the drafts (read or still on the
//! device), its logprobs and its verdict.

use crate::engine::Engine;
use crate::error::EngineError;
use crate::sampling::Sampler;
use crate::speculation::rejection;
use crate::target_states::States;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::Array;
use plugin_api::{CacheBox, TargetWants};
use std::time::Instant;

/// A verify queued on the device.
pub(super) struct Round {
    /// Pending, then the drafts (read with the verdict when they were
    /// drafted ahead: `unread`).
    pub input: Vec<u32>,
    /// uint32 `[k+1]`: the input, when it is still on the device.
    unread: Option<Array>,
    pub k: usize,
    /// Logprobs `[k+1, V]` at every position.
    pub lps: Array,
    /// uint32: the target's choice at each position `[k+1]` (exact match),
    /// or the rejection-sampling verdict `[2k+1]`.
    pub out: Array,
    pub rejection: bool,
    /// When the graph was built, before MLX was handed it (`async_eval`).
    pub built: Instant,
    /// Host time MLX took to take the graph (`async_eval`: encoding and
    /// launching its kernels).
    pub launch_ms: f64,
}

impl Round {
    /// The target's choice at the last position, uint32 `[1]` (unread): the
    /// bonus token when every draft is accepted.
    pub(super) fn bonus(&self) -> Array {
        self.out.index(self.k as i32..self.k as i32 + 1)
    }

    pub(super) fn width(&self) -> usize {
        self.k + 1
    }

    /// Waits for the verdict (and an unread input) and reads them.
    pub(super) fn read(&mut self) -> Result<(), EngineError> {
        match self.unread.take() {
            Some(input) => {
                mlx_rs::transforms::eval([&self.out, &input])?;
                self.input = input.as_slice::<u32>().to_vec();
            }
            None => self.out.eval()?,
        }
        Ok(())
    }
}

/// A verify's input as the host has it.
pub(super) enum Input {
    Read(Vec<u32>),
    /// uint32 `[k+1]` on the device.
    Unread(Array),
}

/// Queues one verify of `tokens` (int32 `[1, k+1]`: pending + drafts,
/// `input` as read or not) and its verdict, under the grammar's masks
/// (`[k+1, ceil(V/32)]` bit words) when the request has one. With `wants`,
/// the verify also keeps those target states for the drafter.
#[allow(clippy::too_many_arguments)]
pub(super) fn queue_verify(
    engine: &Engine,
    tokens: &Array,
    input: Input,
    q: Option<&Array>,
    masks: Option<Vec<u32>>,
    caches: &mut [CacheBox],
    sampler: &mut Sampler,
    wants: Option<&TargetWants>,
) -> Result<(Round, Option<States>), EngineError> {
    let k = tokens.shape()[1] as usize - 1;
    let (input, unread) = match input {
        Input::Read(v) => (v, None),
        Input::Unread(a) => (Vec::new(), Some(a)),
    };
    let (logits, states) = match wants {
        Some(w) => {
            let first = caches.first().map_or(0, |c| c.offset());
            let (l, s) = engine.forward_all_states(tokens, caches, w, first)?;
            (l, Some(s))
        }
        None => (engine.forward_all(tokens, caches)?, None),
    };
    let mut logits = sampler.bias(logits)?;
    if let Some(mut m) = masks {
        // (Rows past k+1 belong to drafts a layout's refusal dropped.)
        let words = (logits.shape()[logits.ndim() - 1] as usize).div_ceil(32);
        m.truncate((k + 1) * words);
        logits = Sampler::constrain(&logits, &m)?;
    }
    // One logprobs op over all rows (reductions stay within a row), then
    // rejection sampling against q, or the target's own choice at every
    // position (one argmax when greedy, one draw per position otherwise).
    let lps = Sampler::logprobs(&logits)?;
    let (out, rejection) = match q {
        Some(q) => (rejection::verdict(&sampler.probabilities(&lps)?, q, &input[1..], sampler)?, true),
        None if sampler.params.is_greedy() => {
            (mlx_rs::ops::indexing::argmax_axis(&lps, -1, None)?.as_dtype(mlx_rs::Dtype::Uint32)?, false)
        }
        None => {
            let draws = (0..=k as i32).map(|i| sampler.sample(&lps.index(i..i + 1))).collect::<Result<Vec<_>, _>>()?;
            (mlx_rs::ops::concatenate(&draws, 0)?.as_dtype(mlx_rs::Dtype::Uint32)?, false)
        }
    };
    crate::graph_dump::dump("verify", &out);
    let built = Instant::now();
    mlx_rs::transforms::async_eval([&out])?;
    let launch_ms = built.elapsed().as_secs_f64() * 1e3;
    Ok((Round { input, unread, k, lps, out, rejection, built, launch_ms }, states))
}
