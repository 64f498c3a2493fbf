//! `host serve --tp N`: rank 0's engine loop leads, every other rank follows.
//!
//! Every rank holds the same engine over its own part of the model, and the
//! model's collectives need every rank to run the same forward passes in the
//! same order. Each rank runs the same batch scheduler (`batch`), which is
//! deterministic given what it is told; what only rank 0 sees is broadcast
//! at the points where it enters the scheduler (MLX's collectives,
//! `mlx_distributed::Group::broadcast_bytes`), and the followers take rank
//! 0's answer instead of their own:
//!
//! - each look at the queue: the job taken (the request, its grammar by its
//!   source, and its plan; a sampled request without a seed gets one here,
//!   so every rank draws alike; or a whole-input job's inputs and task), "empty", or
//!   the queue's end; once the server shuts down, rank 0 refuses new work
//!   before broadcasting it, so the scheduler's own shutdown checks read a
//!   flag that never rises under `--tp` (`Scheduler::own_shutdown`);
//! - whether a job fits the memory budget now, and how far the prefix cache
//!   must shrink (both read the bytes MLX holds, which differ per rank);
//! - after each batched step, which rows their clients stopped; a job whose
//!   plan is serial instead shares its `Flow` after every token;
//! - the speculation cost rule's timings (`agreed`): a batched round's
//!   measured cost, a serial request's verdict.
//!
//! Followers answer nothing: rank 0 alone serves HTTP. The cost is two or
//! three small broadcasts per step beside the model's own `all_sum`s
//! (docs/benchmarks.md, "Tensor parallelism").
//!
//! Idle: MLX's ring backend polls its sockets while a collective waits, so
//! a follower parked in a broadcast for as long as rank 0's queue stays
//! empty kept a third of a core busy on this machine. Rank 0 instead says
//! "idle" every [`IDLE_TICK`] while its queue is empty, and a follower
//! sleeps that long before the next broadcast: both enter it at about the
//! same time, and a job that arrives meanwhile waits at most one tick.
//!
//! A broadcast that fails (a rank is gone) ends the process: the launcher
//! reports it and stops the others. So does a batched step that fails,
//! since one rank's failure would leave the others waiting in a collective.
//! A whole-input job (embeddings, prompt scoring) is broadcast as its inputs
//! and task and runs on every rank (each rank's forward holds its part of
//! the model); rank 0 answers it.

use crate::engine::Engine;
use crate::error::EngineError;
use crate::input_job::InputJob;
use crate::isolate::wire::{WireJob, WireRequest};
use crate::job::{Event, Flow, Job};
use crate::plan::Mechanism;
use crate::request::GenerateRequest;
use crate::stats::Stats;
use crate::work::Work;
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

/// This process's side, once it joined a lockstep (one per process, as
/// MLX's group is).
static SIDE: std::sync::OnceLock<Side> = std::sync::OnceLock::new();

/// Joins the lockstep before the engine runs anything: rank 0 leads, the
/// others follow.
pub fn enter(lock: Lockstep) {
    let lock = Arc::new(lock);
    let side = if lock.rank() == 0 { Side::Lead(lock) } else { Side::Follow(lock) };
    if SIDE.set(side).is_err() {
        fatal("a process joins the lockstep once");
    }
}

/// This process's side, when it runs in lockstep.
pub(crate) fn side() -> Option<&'static Side> {
    SIDE.get()
}

/// `mine`, or under `--tp` rank 0's: for the decisions read off a clock
/// (the speculation cost rule), which differ per rank.
pub(crate) fn agreed<T: serde::Serialize + serde::de::DeserializeOwned>(mine: T) -> T {
    match side() {
        None => mine,
        Some(side) => side.agree(mine),
    }
}

/// How a process takes part in the lockstep.
pub enum Side {
    /// Rank 0: decides, and broadcasts what it decided.
    Lead(Arc<Lockstep>),
    /// Every other rank: takes rank 0's decisions.
    Follow(Arc<Lockstep>),
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

    /// Rank 0's `msg` on every rank (the others pass None).
    fn share(&self, msg: Option<&Value>) -> Value {
        let bytes = msg.map(|m| m.to_string().into_bytes());
        let got = self.group.broadcast_bytes(bytes.as_deref()).unwrap_or_else(|e| fatal(&e));
        serde_json::from_slice(&got).unwrap_or_else(|e| fatal(&format!("rank 0 sent something unreadable ({e})")))
    }

    fn share_flow(&self, flow: Option<Flow>) -> Flow {
        let v = self.share(flow.map(|f| json!(f == Flow::Stop)).as_ref());
        if v.as_bool() == Some(true) {
            Flow::Stop
        } else {
            Flow::Continue
        }
    }
}

impl Side {
    fn lock(&self) -> &Lockstep {
        match self {
            Side::Lead(l) | Side::Follow(l) => l,
        }
    }

    /// Rank 0's `mine` on every rank.
    pub(crate) fn agree<T: serde::Serialize + serde::de::DeserializeOwned>(&self, mine: T) -> T {
        let sent = match self {
            Side::Lead(_) => Some(serde_json::to_value(&mine).expect("serializable")),
            Side::Follow(_) => None,
        };
        let got = self.lock().share(sent.as_ref());
        serde_json::from_value(got).unwrap_or_else(|e| fatal(&format!("rank 0 sent an unexpected value ({e})")))
    }
}

/// What a look at the queue found, the same on every rank.
pub(crate) enum Intake {
    Work(Work),
    Empty,
    Closed,
}

/// Why a request cannot run in lockstep (the server answers 400 before
/// queueing it; rank 0 checks again before broadcasting).
pub fn refusal(req: &GenerateRequest) -> Option<&'static str> {
    // What `WireRequest::from_request` cannot carry.
    req.constraint
        .as_ref()
        .is_some_and(|c| c.source().is_none())
        .then_some("this request's constraint has no grammar source to send to the other ranks")
}

/// Ends the process: the ranks can no longer run in step.
pub(crate) fn fatal(why: &str) -> ! {
    eprintln!("--tp: the ranks lost step ({why}); exiting");
    std::process::exit(1);
}

/// Rank 0: the next job, waiting as long as the queue stays empty (None:
/// the queue ended).
pub(crate) fn lead_wait(
    lock: &Lockstep,
    rx: &crate::queue::Inbox<Work>,
    stats: &Stats,
    shutdown: &AtomicBool,
) -> Option<Work> {
    use std::sync::mpsc::RecvTimeoutError;
    loop {
        match rx.recv_timeout(IDLE_TICK) {
            Ok(w) => {
                if let Some(w) = announce(lock, w, stats, shutdown) {
                    return Some(w);
                }
            }
            Err(RecvTimeoutError::Timeout) => {
                lock.share(Some(&json!({ "idle": true })));
            }
            Err(RecvTimeoutError::Disconnected) => {
                lock.share(Some(&json!({ "end": true })));
                return None;
            }
        }
    }
}

/// Rank 0: the next job if one is queued now.
pub(crate) fn lead_try(
    lock: &Lockstep,
    rx: &crate::queue::Inbox<Work>,
    stats: &Stats,
    shutdown: &AtomicBool,
) -> Intake {
    use std::sync::mpsc::TryRecvError;
    loop {
        match rx.try_recv() {
            Ok(w) => {
                if let Some(w) = announce(lock, w, stats, shutdown) {
                    return Intake::Work(w);
                }
            }
            Err(TryRecvError::Empty) => {
                lock.share(Some(&json!({ "empty": true })));
                return Intake::Empty;
            }
            Err(TryRecvError::Disconnected) => {
                lock.share(Some(&json!({ "end": true })));
                return Intake::Closed;
            }
        }
    }
}

/// A follower: what rank 0's next look at its queue found.
pub(crate) fn follow_intake(lock: &Arc<Lockstep>, engine: &Engine, waiting: bool) -> Intake {
    loop {
        let msg = lock.share(None);
        if msg.get("idle").is_some() && waiting {
            std::thread::sleep(IDLE_TICK);
            continue;
        }
        if msg.get("end").is_some() {
            return Intake::Closed;
        }
        if msg.get("empty").is_some() && !waiting {
            return Intake::Empty;
        }
        if let Some(job) = msg.get("inputs") {
            let (inputs, task) = serde_json::from_value(job.clone())
                .unwrap_or_else(|e| fatal(&format!("a whole-input job I cannot read ({e})")));
            return Intake::Work(Work::Inputs(InputJob { inputs, task, on_done: Box::new(|_| {}) }));
        }
        match msg.get("job").map(|j| rebuild(engine, j, lock)) {
            Some(Ok(job)) => return Intake::Work(Work::Generate(Box::new(job))),
            Some(Err(e)) => fatal(&format!("a job I cannot run: {e}")),
            None => fatal(&format!("unexpected message {msg}")),
        }
    }
}

/// Rank 0 takes `work` in and broadcasts it; what cannot cross is refused
/// here, and so is everything once the server shuts down (the followers
/// never hear of it).
fn announce(lock: &Lockstep, work: Work, stats: &Stats, shutdown: &AtomicBool) -> Option<Work> {
    let closing = shutdown.load(Ordering::SeqCst);
    let mut job = match work {
        Work::Inputs(e) if closing => {
            stats.queued.fetch_sub(1, Ordering::SeqCst);
            (e.on_done)(Err(EngineError::InvalidRequest("the server is shutting down".into())));
            return None;
        }
        Work::Inputs(e) => {
            lock.share(Some(&json!({ "inputs": (&e.inputs, e.task) })));
            return Some(Work::Inputs(e));
        }
        Work::Generate(job) => *job,
    };
    // Every rank samples with the same seed.
    if job.request.params.temperature > 0.0 && job.request.params.seed.is_none() {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        job.request.params.seed = Some(now.map_or(0, |d| d.as_nanos() as u64));
    }
    let Some(request) = (!closing).then(|| WireRequest::from_request(&job.request)).flatten() else {
        stats.queued.fetch_sub(1, Ordering::SeqCst);
        let why = if closing { "the server is shutting down" } else { refusal(&job.request).unwrap_or_default() };
        let _ = (job.on_event)(Event::Failed(EngineError::InvalidRequest(why.into())));
        return None;
    };
    let wire = WireJob { id: 0, request, plan: job.plan.clone() };
    lock.share(Some(&json!({ "job": wire })));
    Some(Work::Generate(Box::new(job)))
}

/// Rank 0's callback for a job whose plan is serial: each token's flow is
/// broadcast (shutdown counts as the client stopping).
pub(crate) fn lead_serial(lock: Arc<Lockstep>, mut job: Job, shutdown: Arc<AtomicBool>) -> Job {
    let mut inner = std::mem::replace(&mut job.on_event, Box::new(|_| Flow::Continue));
    job.on_event = Box::new(move |ev| {
        let token = matches!(ev, Event::Token(_));
        let mut flow = inner(ev);
        if !token {
            return flow;
        }
        if shutdown.load(Ordering::SeqCst) {
            flow = Flow::Stop;
        }
        lock.share_flow(Some(flow))
    });
    job
}

/// A follower's copy of rank 0's job: a serial plan hears each token's flow
/// from rank 0; a batched row's stops come after each step.
fn rebuild(engine: &Engine, v: &Value, lock: &Arc<Lockstep>) -> Result<Job, String> {
    let wire: WireJob = serde_json::from_value(v.clone()).map_err(|e| e.to_string())?;
    let request = wire.request.into_request(engine.text().map(|t| &**t))?;
    let on_event: Box<dyn FnMut(Event) -> Flow + Send> = if wire.plan.mechanism == Mechanism::Serial {
        let lock = lock.clone();
        Box::new(move |ev| if matches!(ev, Event::Token(_)) { lock.share_flow(None) } else { Flow::Continue })
    } else {
        Box::new(|_| Flow::Continue)
    };
    Ok(Job { request, plan: wire.plan, on_event })
}
