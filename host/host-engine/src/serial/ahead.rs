//! Pipelined rounds: the next round drafted and queued on the device while
//! the current verify runs, as if it accepts every draft, so that the host
//! builds rounds while the device computes them (as the plain loop does
//! steps). Greedy requests without a grammar only: the round's input is the
//! current verify's bonus token, unread, and its drafts come from the
//! drafter's `draft_ahead`, unread too. The caches hold it as a younger
//! round (`caps::SPEC_PIPELINE`): settling the current round commits the
//! oldest, and a rollback of the current round drops it with the rest.

use super::decoding::Decoding;
use super::verify::{queue_verify, Input, Round};
use crate::engine::Engine;
use crate::error::{model_err, EngineError};
use crate::speculation::{draft_sampling, SpecStats};
use crate::target_states::States;
use crate::tensors::{tensor_array, tensor_ref};
use plugin_api::abi_stable::std_types::{ROption, RSlice};
use plugin_api::{AheadArgs, CacheBox, DrafterBox, TargetWants};

/// A round queued ahead of the previous round's verdict.
pub(super) struct Queued {
    pub round: Round,
    pub states: Option<States>,
    /// The caches' offsets where it began.
    pub starts: Vec<u64>,
    /// Host time the drafter took to build its drafts (the step trace).
    pub draft_ms: f64,
}

/// Whether the request's rounds may be pipelined: greedy (the bonus token
/// is the verify's argmax) and no grammar (its masks need each token read).
pub(super) fn allowed(d: &Decoding) -> bool {
    d.sampler.params.is_greedy() && d.constraint.is_none()
}

/// Asks the drafter for the round after `round` (`n` drafts at most) and
/// queues its verify. `Ok(None)`: the drafter declined; `Err(why)`: it
/// failed, and the request stops speculating.
#[allow(clippy::too_many_arguments)]
pub(super) fn queue(
    engine: &Engine,
    d: &mut Decoding,
    caches: &mut [CacheBox],
    drafter: &mut DrafterBox,
    wants: &TargetWants,
    round: &Round,
    states: &States,
    n: usize,
) -> Result<Result<Option<Queued>, String>, EngineError> {
    let pending = round.bonus();
    let history_len = d.history.len() + round.width();
    let sampling = draft_sampling(&d.sampler, history_len);
    let since = std::time::Instant::now();
    let answer = states.lend(|s| {
        drafter.draft_ahead(AheadArgs {
            history_len: history_len as u64,
            pending: tensor_ref(&pending),
            max_tokens: n as u32,
            sampling,
            states: s,
        })
    });
    let drafts = match answer.into_result() {
        Ok(ROption::RSome(t)) => tensor_array(t),
        Ok(ROption::RNone) => return Ok(Ok(None)),
        Err(e) => return Ok(Err(format!("the drafter failed to draft ahead ({e}): plain steps from here"))),
    };
    let draft_ms = since.elapsed().as_secs_f64() * 1e3;
    if drafts.ndim() != 1 || drafts.shape()[0] as usize > n {
        return Ok(Err(format!(
            "the drafter drafted ahead a {:?} array where at most [{n}] fits: plain steps from here",
            drafts.shape()
        )));
    }
    let starts: Vec<u64> = caches.iter().map(|c| c.offset()).collect();
    for c in caches.iter_mut() {
        c.spec_begin().into_result().map_err(model_err("spec_begin"))?;
    }
    let input = mlx_rs::ops::concatenate(&[&pending, &drafts.as_dtype(mlx_rs::Dtype::Uint32)?], 0)?;
    let tokens = input.as_dtype(mlx_rs::Dtype::Int32)?.reshape(&[1, -1])?;
    let (round, states) =
        queue_verify(engine, &tokens, Input::Unread(input), None, None, caches, &mut d.sampler, Some(wants))?;
    Ok(Ok(Some(Queued { round, states, starts, draft_ms })))
}

/// Drops a queued round from the caches (the request ends or stops
/// speculating after a round that accepted everything).
pub(super) fn drop_queued(
    engine: &Engine,
    caches: &mut [CacheBox],
    queued: &mut Option<Queued>,
    stats: &mut SpecStats,
) -> Result<(), EngineError> {
    let Some(q) = queued.take() else { return Ok(()) };
    for c in caches.iter_mut() {
        c.spec_rollback(RSlice::from_slice(&[0])).into_result().map_err(model_err("spec_rollback"))?;
    }
    engine.replay_if_restored(&q.starts, &[], caches)?;
    stats.pipelined_dropped += 1;
    Ok(())
}
