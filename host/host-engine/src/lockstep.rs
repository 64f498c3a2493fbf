//! `host serve --tp N`: rank 0's worker leads, every other rank follows.
//!
//! Every rank holds the same engine over its own part of the model, and the
//! model's collectives need every rank to run the same forward passes in the
//! same order. The serial executor is deterministic given its inputs, so
//! each rank runs it; what only rank 0 sees is broadcast at the points where
//! it enters (MLX's collectives, `mlx_distributed::Group::broadcast_bytes`):
//!
//! - the next job, when rank 0's loop takes one from its queue (the request
//!   and its plan's switches; a sampled request without a seed gets one
//!   here, so every rank draws alike), or the queue's end;
//! - after each token, rank 0's `Flow` (its client's answer, or shutdown).
//!
//! Followers answer nothing: rank 0 alone serves HTTP. The cost is one
//! small broadcast per token and per job beside the model's own `all_sum`s.
//!
//! Idle: MLX's ring backend polls its sockets while a collective waits, so
//! a follower parked in a broadcast for as long as rank 0's queue stays
//! empty kept a third of a core busy on this machine. Rank 0 instead says
//! "idle" every [`IDLE_TICK`] while its queue is empty, and a follower
//! sleeps that long before the next broadcast: both enter it at about the
//! same time, and a job that arrives meanwhile waits at most one tick.
//! What does not run in lockstep is refused on rank 0 before anything is
//! broadcast: continuous batching (`--tp` serves one request at a time),
//! embeddings, grammars (a constraint's matcher lives in rank 0's process).

use crate::embed::EmbedJob;
use crate::engine::{Engine, EngineError};
use crate::job::{Event, Flow, GenerateRequest, Job};
use crate::queue::Inbox;
use crate::sampling::SamplingParams;
use crate::stats::Stats;
use crate::worker::Work;
use mlx_distributed::Group;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How often an idle rank 0 tells the followers there is nothing to run.
pub const IDLE_TICK: Duration = Duration::from_millis(50);

/// This process's place in the group the model is split over.
pub struct Lockstep {
    group: Group,
}

impl Lockstep {
    /// The process group the host joined at start (`--tp`).
    pub fn current() -> Result<Self, EngineError> {
        let group = Group::current().map_err(EngineError::Model)?;
        Ok(Self { group })
    }

    pub fn rank(&self) -> usize {
        self.group.rank()
    }

    fn share(&self, msg: Option<&Value>) -> Result<Value, EngineError> {
        let bytes = msg.map(|m| m.to_string().into_bytes());
        let got = self.group.broadcast_bytes(bytes.as_deref()).map_err(EngineError::Model)?;
        serde_json::from_slice(&got).map_err(|e| EngineError::Model(format!("lockstep: rank 0 sent {e}")))
    }

    fn share_flow(&self, flow: Option<Flow>) -> Result<Flow, EngineError> {
        let v = self.share(flow.map(|f| json!(f == Flow::Stop)).as_ref())?;
        Ok(if v.as_bool() == Some(true) { Flow::Stop } else { Flow::Continue })
    }
}

fn describe(job: &Job) -> Value {
    let (r, p) = (&job.request, &job.request.params);
    json!({
        "prompt": r.prompt,
        "max_tokens": r.max_tokens,
        "stop_on_eos": r.stop_on_eos,
        "logprobs": r.logprobs,
        "params": {
            "temperature": p.temperature, "top_p": p.top_p, "top_k": p.top_k, "min_p": p.min_p,
            "repetition_penalty": p.repetition_penalty, "presence_penalty": p.presence_penalty,
            "frequency_penalty": p.frequency_penalty, "penalty_context": p.penalty_context,
            "seed": p.seed, "logit_bias": p.logit_bias,
        },
        "prompt_cache": job.plan.prompt_cache,
        "checkpoint": job.plan.checkpoint,
        "compiled_decode": job.plan.compiled_decode,
    })
}

fn rebuild(engine: &Engine, v: &Value) -> Option<(GenerateRequest, crate::plan::ResolvedExecution)> {
    let p = v.get("params")?;
    let f = |k: &str| p.get(k).and_then(Value::as_f64).map(|x| x as f32);
    let params = SamplingParams {
        temperature: f("temperature")?,
        top_p: f("top_p")?,
        top_k: p.get("top_k")?.as_u64()? as u32,
        min_p: f("min_p")?,
        repetition_penalty: f("repetition_penalty")?,
        presence_penalty: f("presence_penalty")?,
        frequency_penalty: f("frequency_penalty")?,
        penalty_context: p.get("penalty_context")?.as_u64()? as usize,
        seed: p.get("seed")?.as_u64(),
        logit_bias: serde_json::from_value(p.get("logit_bias")?.clone()).ok()?,
        resume_draws: 0,
    };
    let request = GenerateRequest {
        prompt: serde_json::from_value(v.get("prompt")?.clone()).ok()?,
        max_tokens: v.get("max_tokens")?.as_u64()? as usize,
        params,
        stop_on_eos: v.get("stop_on_eos")?.as_bool()?,
        logprobs: v.get("logprobs")?.as_u64().map(|n| n as usize),
        constraint: None,
    };
    let mut plan = engine.plan(&request, 1);
    plan.method = crate::plan::Method::Autoregressive;
    plan.mechanism = crate::plan::Mechanism::Serial;
    plan.prompt_cache = v.get("prompt_cache")?.as_bool()?;
    plan.checkpoint = v.get("checkpoint")?.as_bool()?;
    plan.compiled_decode = v.get("compiled_decode")?.as_bool()?;
    Some((request, plan))
}

/// Why a request cannot run in lockstep (the server answers 400 before
/// queueing it; rank 0 checks again before broadcasting).
pub fn refusal(req: &GenerateRequest) -> Option<&'static str> {
    req.constraint.is_some().then_some("structured output and forced tool calls are not served with --tp")
}

fn refuse_embeddings(e: EmbedJob, stats: &Stats) {
    stats.queued.fetch_sub(1, Ordering::SeqCst);
    (e.on_done)(Err(EngineError::InvalidRequest("embeddings are not served with --tp".into())));
}

fn fatal(e: EngineError) -> ! {
    eprintln!("--tp: rank 0 lost the other ranks ({e}); exiting");
    std::process::exit(1);
}

/// Rank 0's engine loop: `worker`'s serial loop, broadcasting each job and
/// each token's `Flow` to the followers. A failed broadcast (a rank is gone)
/// ends the process: the launcher reports it and stops the others.
pub(crate) fn lead(engine: Engine, rx: Inbox<Work>, stats: Arc<Stats>, shutdown: Arc<AtomicBool>, lock: Arc<Lockstep>) {
    loop {
        let next = crate::idle::wait_with(&rx, &stats, |rx| loop {
            match rx.recv_timeout(IDLE_TICK) {
                Ok(w) => return Some(w),
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return None,
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    if let Err(e) = lock.share(Some(&json!({ "idle": true }))) {
                        fatal(e)
                    }
                }
            }
        });
        let Some(work) = next else { break };
        let mut job = match work {
            Work::Generate(job) => *job,
            Work::Embed(e) => {
                refuse_embeddings(e, &stats);
                continue;
            }
        };
        stats.queued.fetch_sub(1, Ordering::SeqCst);
        if let Some(why) = refusal(&job.request) {
            let _ = (job.on_event)(Event::Failed(EngineError::InvalidRequest(why.into())));
            continue;
        }
        if shutdown.load(Ordering::SeqCst) {
            let _ = (job.on_event)(Event::Failed(EngineError::InvalidRequest("the server is shutting down".into())));
            continue;
        }
        // Every rank samples with the same seed.
        if job.request.params.temperature > 0.0 && job.request.params.seed.is_none() {
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
            job.request.params.seed = Some(now.map_or(0, |d| d.as_nanos() as u64));
        }
        if let Err(e) = lock.share(Some(&json!({ "job": describe(&job) }))) {
            fatal(e)
        }
        let mut inner = std::mem::replace(&mut job.on_event, Box::new(|_| Flow::Continue));
        let (lock, stop) = (lock.clone(), shutdown.clone());
        job.on_event = Box::new(move |ev| {
            let token = matches!(ev, Event::Token(_));
            let mut flow = inner(ev);
            if !token {
                return flow;
            }
            if stop.load(Ordering::SeqCst) {
                flow = Flow::Stop;
            }
            match lock.share_flow(Some(flow)) {
                Ok(f) => f,
                Err(e) => fatal(e),
            }
        });
        crate::serial::run(&engine, job, &stats, &shutdown);
    }
    let _ = lock.share(Some(&json!({ "end": true })));
}

/// A follower's loop: runs every job rank 0 announces, as rank 0 runs it,
/// until rank 0's queue ends. Returns the reason it stopped.
pub fn follow(engine: &Engine, lock: Arc<Lockstep>) -> Result<(), EngineError> {
    let stats = Stats::default();
    let shutdown = AtomicBool::new(false);
    loop {
        let msg = lock.share(None)?;
        if msg.get("end").is_some() {
            return Ok(());
        }
        if msg.get("idle").is_some() {
            std::thread::sleep(IDLE_TICK);
            continue;
        }
        let desc = msg.get("job").ok_or_else(|| EngineError::Model(format!("lockstep: unexpected {msg}")))?;
        let (request, plan) = rebuild(engine, desc)
            .ok_or_else(|| EngineError::Model(format!("lockstep: a job I cannot read: {desc}")))?;
        let each = lock.clone();
        let failed = Arc::new(AtomicBool::new(false));
        let seen = failed.clone();
        let job = Job {
            request,
            plan,
            on_event: Box::new(move |ev| {
                if !matches!(ev, Event::Token(_)) {
                    return Flow::Continue;
                }
                each.share_flow(None).unwrap_or_else(|_| {
                    seen.store(true, Ordering::SeqCst);
                    Flow::Stop
                })
            }),
        };
        crate::serial::run(engine, job, &stats, &shutdown);
        if failed.load(Ordering::SeqCst) {
            return Err(EngineError::Model("lost rank 0".into()));
        }
    }
}
