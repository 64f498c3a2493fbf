//! The serial executor: one request alone on the device, as its plan says
//! (plainly or speculatively; with or without the prefix cache).
//!
//! The prompt is processed as mlx-lm's `generate_step` does: all but the
//! last token as prefill (chunks of `prefill_step`), then the last token
//! alone produces the first logits. Same graphs, same numbers.

mod ahead;
mod decoding;
mod plain;
mod speculative;
mod verify;

use crate::engine::Engine;
use crate::error::EngineError;
use crate::job::{Event, Finish, Flow, GenerateResult, Job, TokenOut};
use crate::plan::{Method, ResolvedExecution};
use crate::request::GenerateRequest;
use crate::stats::Stats;
use crate::target_states::States;
use decoding::Decoding;
use plugin_api::{CacheBox, TargetWants};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

pub(crate) use decoding::logprob_of;

/// Generates for one request as `plan` says.
pub fn generate(
    engine: &Engine,
    req: &GenerateRequest,
    plan: &ResolvedExecution,
    mut on_token: impl FnMut(&TokenOut) -> Flow,
) -> Result<GenerateResult, EngineError> {
    engine.check_request(req)?;
    let start = Instant::now();
    // The target states the drafter reads, when this request speculates.
    let wants = match (plan.method, engine.drafting()) {
        (Method::Speculative, Some(d)) => d.reads_states().cloned(),
        _ => None,
    };
    let (mut caches, cached, prompt_states) = start_request(engine, req, plan, wants.as_ref())?;
    // (Its own copy: the grammar's matcher moves with the tokens.)
    let mut d = Decoding::new(engine, req.clone())?;
    let (finish, speculation) = match (plan.method, engine.drafting()) {
        (Method::Speculative, Some(drafting)) => {
            let mut drafter =
                drafting.shared.lock().map_err(|_| EngineError::Model("the drafter's lock is poisoned".into()))?;
            let (finish, stats) =
                speculative::decode(engine, &mut d, &mut caches, drafting, &mut drafter, prompt_states, &mut on_token)?;
            (finish, Some(stats))
        }
        _ => (plain::decode(engine, &mut d, &mut caches, usize::MAX, &mut on_token)?.unwrap_or(Finish::Length), None),
    };
    if plan.prompt_cache {
        engine.prefix().put_final(&d.history, &mut caches);
    }
    let first_at = d.first_at.unwrap_or_else(Instant::now);
    Ok(GenerateResult {
        tokens: d.out,
        finish,
        prompt_tokens: d.req.prompt.len(),
        cached_tokens: cached,
        speculation,
        prefill_s: (first_at - start).as_secs_f64(),
        decode_s: first_at.elapsed().as_secs_f64(),
    })
}

/// Prefills all but the prompt's last token into fresh caches, from the
/// prefix cache where the plan allows; returns the caches and the prompt
/// tokens the prefix cache served, and the states `wants` asks for over the
/// positions prefilled here.
fn start_request(
    engine: &Engine,
    req: &GenerateRequest,
    plan: &ResolvedExecution,
    wants: Option<&TargetWants>,
) -> Result<(Vec<CacheBox>, usize, Option<States>), EngineError> {
    let mut caches = engine.new_caches()?;
    let head = &req.prompt[..req.prompt.len() - 1];
    let cached = if plan.prompt_cache {
        let fresh = || engine.new_caches().ok();
        engine.prefix().take(&req.prompt, &mut caches, &fresh)
    } else {
        0
    };
    let states = match wants {
        Some(w) => Some(engine.prefill_states(&head[cached..], &mut caches, w, cached as u64)?),
        None => {
            engine.prefill(&head[cached..], &mut caches)?;
            None
        }
    };
    if plan.prompt_cache && cached < head.len() {
        // A prompt-boundary snapshot: what the next turn of a chat reuses
        // even when its caches cannot trim (a wrapped ring).
        let t = std::time::Instant::now();
        engine.prefix().put(head, &caches);
        tracing::trace!(target: "host_engine::step", ms = t.elapsed().as_secs_f64() * 1e3, "prompt snapshot");
    }
    Ok((caches, cached, states))
}

/// Runs one job alone, reporting to its callback and to `stats`.
pub(crate) fn run(engine: &Engine, mut job: Job, stats: &Stats, shutdown: &AtomicBool) {
    stats.requests.fetch_add(1, Ordering::SeqCst);
    stats.active.fetch_add(1, Ordering::SeqCst);
    stats.prompt_tokens.fetch_add(job.request.prompt.len() as u64, Ordering::SeqCst);
    let mut produced = 0u64;
    let mut stopped_by_caller = false;
    let result = generate(engine, &job.request, &job.plan, |t| {
        produced += 1;
        stats.generated_tokens.fetch_add(1, Ordering::SeqCst);
        let flow = (job.on_event)(Event::Token(t.clone()));
        if flow == Flow::Stop || shutdown.load(Ordering::SeqCst) {
            stopped_by_caller = true;
            return Flow::Stop;
        }
        Flow::Continue
    });
    stats.active.fetch_sub(1, Ordering::SeqCst);
    match result {
        Ok(r) => {
            stats.record(&r, engine);
            if stopped_by_caller && r.finish == Finish::Stop {
                stats.cancelled.fetch_add(1, Ordering::SeqCst);
                stats.last_cancelled_tokens.store(produced, Ordering::SeqCst);
            } else {
                stats.completed.fetch_add(1, Ordering::SeqCst);
            }
            let _ = (job.on_event)(Event::Done(r));
        }
        Err(e) => {
            stats.failed.fetch_add(1, Ordering::SeqCst);
            let _ = (job.on_event)(Event::Failed(e));
        }
    }
}
