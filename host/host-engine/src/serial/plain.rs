//! Plain decoding, one token per step, with the next step queued on the
//! device (async eval) before the previous token is read, so the host
//! builds graphs while the device computes. Penalties read the full
//! history and a grammar's mask needs the last token, so those steps wait
//! for each token (a grammar's mask is computed while the step's forward
//! runs).

use super::decoding::Decoding;
use crate::constraint::Constraint;
use crate::engine::Engine;
use crate::error::EngineError;
use crate::job::{Finish, Flow, TokenOut};
use crate::sampling::Sampler;
use crate::tensors::token_array;
use crate::thread_clock;
use mlx_rs::Array;
use plugin_api::CacheBox;
use std::time::Instant;

/// Serial decode steps between clearings of MLX's buffer cache (as
/// mlx-lm's `generate_step`).
const CLEAR_CACHE_EVERY: usize = 256;

/// Plain steps until the request ends (`Some`: EOS, the caller's stop, or
/// `max_tokens`) or `limit` more tokens were emitted (`None`, with nothing
/// queued, so speculation can take over again).
pub(crate) fn decode(
    engine: &Engine,
    d: &mut Decoding,
    caches: &mut [CacheBox],
    limit: usize,
    on_token: &mut impl FnMut(&TokenOut) -> Flow,
) -> Result<Option<Finish>, EngineError> {
    let budget = limit.min(d.room());
    if budget == 0 {
        return Ok((d.room() == 0).then_some(Finish::Length));
    }
    let pipelined = !d.req.params.has_penalties() && d.constraint.is_none();
    let pending = *d.history.last().expect("a decoding has a prompt");
    let (mut y, mut lp) =
        step(engine, &mut d.sampler, d.constraint.as_mut(), &token_array(&[pending]), &d.history, caches)?;
    for n in 0..budget {
        let next = if pipelined && n + 1 < budget {
            Some(step(engine, &mut d.sampler, None, &y.reshape(&[1, 1])?, &d.history, caches)?)
        } else {
            None
        };
        let id = y.try_item_cast::<u32>()?;
        if let Some(f) = d.emit(id, &lp, on_token)? {
            return Ok(Some(f));
        }
        if engine.checkpoint_due(d.out.len()) {
            engine.checkpoint_caches(&d.history, caches);
        }
        if n + 1 == budget {
            break;
        }
        if d.out.len().is_multiple_of(CLEAR_CACHE_EVERY) {
            crate::runtime::clear_cache();
        }
        (y, lp) = match next {
            Some(v) => v,
            None => step(engine, &mut d.sampler, d.constraint.as_mut(), &token_array(&[id]), &d.history, caches)?,
        };
    }
    Ok(None)
}

/// One step's token (lazy, queued on the device) and the logprobs it was
/// drawn from, under `constraint`'s mask when there is one.
fn step(
    engine: &Engine,
    sampler: &mut Sampler,
    constraint: Option<&mut Constraint>,
    input: &Array,
    history: &[u32],
    caches: &mut [CacheBox],
) -> Result<(Array, Array), EngineError> {
    let (t0, cpu0) = (Instant::now(), thread_clock::now());
    let logits = engine.forward(input, caches, true)?;
    let mask = match constraint {
        Some(c) => {
            // The device runs the forward while the CPU walks the grammar.
            mlx_rs::transforms::async_eval([&logits])?;
            Some(c.allowed_words()?)
        }
        None => None,
    };
    let mut logits = sampler.process(logits, history)?;
    if let Some(mask) = &mask {
        logits = Sampler::constrain(&logits, mask)?;
    }
    let lp = Sampler::logprobs(&logits)?;
    let y = sampler.sample(&lp)?;
    crate::graph_dump::dump("step", &y);
    let t1 = Instant::now();
    mlx_rs::transforms::async_eval([&y])?;
    tracing::trace!(
        target: "host_engine::step",
        graph_ms = (t1 - t0).as_secs_f64() * 1e3,
        launch_ms = t1.elapsed().as_secs_f64() * 1e3,
        cpu_ms = thread_clock::ms_since(cpu0),
        "plain step"
    );
    Ok((y, lp))
}
