//! One thread owns the engine and runs requests in arrival order; callers
//! submit jobs (generation, or embeddings) to a bounded queue (`queue`: a
//! request's jobs go in together) and hear back through a callback. MLX work for the served model therefore never runs
//! on two threads at once.
//!
//! Cancellation: the callback returns `Flow::Stop` (client gone, stop string
//! matched, shutdown), which the decode loop honours after the current step:
//! a cancelled request stops within one decode step and its caches are freed
//! with the job.

use crate::admission::{Budget, MemoryModel};
use crate::batch::Scheduler;
use crate::engine::Engine;
use crate::error::EngineError;
use crate::hold::Hold;
use crate::input_job::InputJob;
use crate::isolate::{EngineHealth, Remote, Supervisor};
use crate::job::{Event, Job};
use crate::queue::{Inbox, Outbox, Refused};
use crate::stats::Stats;
use crate::work::{SubmitError, Work};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::TryRecvError;
use std::sync::Arc;
use std::thread::JoinHandle;

pub struct Worker {
    backend: Backend,
    pub stats: Arc<Stats>,
}

enum Backend {
    /// The engine runs on a thread of this process.
    Local {
        tx: Option<Outbox<Work>>,
        thread: Option<JoinHandle<()>>,
        /// Pauses the engine's loop between iterations (tests arrange
        /// concurrency with it; `host serve --debug-endpoints` exposes it).
        hold: Arc<Hold>,
        shutdown: Arc<AtomicBool>,
        /// Rank 0 of `--tp`: jobs run in lockstep with the other ranks.
        lockstep: bool,
    },
    /// The engine runs in a child process (`--isolate`).
    Isolated { remote: Arc<Remote>, supervisor: Supervisor },
}

impl Worker {
    /// Starts the engine thread. `batch` rows may share a decode step
    /// (continuous batching); `batch == 1` runs strictly one job at a time.
    pub fn start(engine: Engine, queue: usize, batch: usize, memory: Option<(MemoryModel, Budget)>) -> Self {
        Self::spawn(engine, queue, false, move |engine, rx, s, stop, h| {
            if batch > 1 {
                if let Err(e) = crate::warm_up::padded_rows(&engine) {
                    tracing::warn!("warming up padded rows failed: {e}");
                }
                Scheduler::new(&engine, s, stop, h, batch, memory).run(rx)
            } else {
                run_serially(engine, rx, s, stop, h)
            }
        })
    }

    /// Rank 0 of `--tp N`: the batch scheduler in lockstep with the other
    /// ranks (`lockstep`), which run [`follow`]; at `batch == 1` too (its
    /// plans are then serial), since only the scheduler agrees with them.
    pub fn start_lockstep(
        engine: Engine,
        queue: usize,
        batch: usize,
        memory: Option<(MemoryModel, Budget)>,
        lock: crate::lockstep::Lockstep,
    ) -> Self {
        crate::lockstep::enter(lock);
        Self::spawn(engine, queue, true, move |engine, rx, s, stop, h| {
            Scheduler::new(&engine, s, stop, h, batch, memory).run(rx)
        })
    }

    /// The queue, the engine's counters and switches, and the engine thread
    /// running `run` over them.
    fn spawn(
        engine: Engine,
        queue: usize,
        lockstep: bool,
        run: impl FnOnce(Engine, Inbox<Work>, Arc<Stats>, Arc<AtomicBool>, Arc<Hold>) + Send + 'static,
    ) -> Self {
        let (tx, rx) = crate::queue::bounded::<Work>(queue);
        let stats = Arc::new(Stats { ssd: engine.prefix().ssd_counters(), ..Stats::default() });
        let shutdown = Arc::new(AtomicBool::new(false));
        let hold = Arc::new(Hold::default());
        let (s, stop, h) = (stats.clone(), shutdown.clone(), hold.clone());
        let thread = std::thread::Builder::new()
            .name("engine".into())
            .spawn(move || run(engine, rx, s, stop, h))
            .expect("engine thread");
        Self { backend: Backend::Local { tx: Some(tx), thread: Some(thread), hold, shutdown, lockstep }, stats }
    }

    /// Why this worker cannot run `req` at all (a 400 before it is queued).
    pub fn refusal(&self, req: &crate::request::GenerateRequest) -> Option<&'static str> {
        match self.backend {
            Backend::Local { lockstep: true, .. } => crate::lockstep::refusal(req),
            _ => None,
        }
    }

    /// A worker whose engine runs in child processes that `supervisor` keeps
    /// alive (`remote` holds the jobs sent to them).
    pub fn isolated(remote: Arc<Remote>, supervisor: Supervisor) -> Self {
        Self { stats: remote.stats.clone(), backend: Backend::Isolated { remote, supervisor } }
    }

    /// The engine child's state, when the engine is isolated.
    pub fn engine_health(&self) -> Option<EngineHealth> {
        match &self.backend {
            Backend::Local { .. } => None,
            Backend::Isolated { supervisor, .. } => Some(supervisor.health()),
        }
    }

    /// MLX's active, cache and peak bytes where the engine runs.
    pub fn mlx_memory(&self) -> [u64; 3] {
        match &self.backend {
            Backend::Local { .. } => [
                crate::runtime::active_memory() as u64,
                crate::runtime::cache_memory() as u64,
                crate::runtime::peak_memory() as u64,
            ],
            Backend::Isolated { remote, .. } => remote.mirror().mlx,
        }
    }

    /// Makes `stats` current (an isolated engine's are pushed when they
    /// change; this asks for them now). A local engine's always are.
    pub fn refresh_stats(&self) {
        if let Backend::Isolated { remote, .. } = &self.backend {
            remote.refresh();
        }
    }

    /// Pauses the engine's loop at its next iteration.
    pub fn hold(&self) {
        match &self.backend {
            Backend::Local { hold, .. } => hold.hold(),
            Backend::Isolated { remote, .. } => remote.hold(),
        }
    }

    /// Lets the held loop run `steps` iterations (None: for good).
    pub fn release(&self, steps: Option<u64>) {
        match (&self.backend, steps) {
            (Backend::Local { hold, .. }, Some(n)) => hold.release_for(n),
            (Backend::Local { hold, .. }, None) => hold.release(),
            (Backend::Isolated { remote, .. }, steps) => remote.release(steps),
        }
    }

    pub fn held(&self) -> bool {
        match &self.backend {
            Backend::Local { hold, .. } => hold.held(),
            Backend::Isolated { remote, .. } => remote.mirror().held,
        }
    }

    /// The held loop is waiting at its checkpoint.
    pub fn parked(&self) -> bool {
        match &self.backend {
            Backend::Local { hold, .. } => hold.parked(),
            Backend::Isolated { remote, .. } => remote.mirror().parked,
        }
    }

    /// The local engine's hold (for a thread that reports it).
    pub fn hold_view(&self) -> Option<Arc<Hold>> {
        match &self.backend {
            Backend::Local { hold, .. } => Some(hold.clone()),
            Backend::Isolated { .. } => None,
        }
    }

    pub fn submit(&self, job: Job) -> Result<(), SubmitError> {
        self.submit_all(vec![job])
    }

    /// Queues one request's jobs (one per choice), all or none: at most
    /// `queue::MAX_GROUP`, refused only when the queue holds its limit.
    pub fn submit_all(&self, jobs: Vec<Job>) -> Result<(), SubmitError> {
        if let Backend::Isolated { remote, .. } = &self.backend {
            return remote.submit_all(jobs);
        }
        self.send(jobs.into_iter().map(|j| Work::Generate(Box::new(j))).collect())
    }

    /// Queues a whole-input job (same queue, same 503 when it is full).
    pub fn inputs(&self, job: InputJob) -> Result<(), SubmitError> {
        if let Backend::Isolated { remote, .. } = &self.backend {
            return remote.inputs(job);
        }
        self.send(vec![Work::Inputs(job)])
    }

    fn send(&self, work: Vec<Work>) -> Result<(), SubmitError> {
        let Backend::Local { tx: Some(tx), .. } = &self.backend else { return Err(SubmitError::Closed) };
        tx.send_all(work, &self.stats.queued).map_err(|e| match e {
            Refused::Full => SubmitError::Full,
            Refused::Closed => SubmitError::Closed,
        })
    }

    /// Asks running and queued work to stop (each job ends within a step).
    pub fn cancel_all(&self) {
        match &self.backend {
            Backend::Local { hold, shutdown, .. } => {
                shutdown.store(true, Ordering::SeqCst);
                hold.release();
            }
            Backend::Isolated { remote, .. } => {
                remote.cancel_all();
                remote.release(None);
            }
        }
    }

    /// Cancels running and queued work, then waits for the thread to end.
    pub fn shutdown(&mut self) {
        self.cancel_all();
        match &mut self.backend {
            Backend::Local { tx, thread, .. } => {
                tx.take();
                if let Some(t) = thread.take() {
                    let _ = t.join();
                }
            }
            Backend::Isolated { remote, supervisor } => supervisor.shutdown(remote),
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// A follower rank of `--tp N`: runs every step rank 0's scheduler runs,
/// as it runs them, until rank 0's queue ends. It serves nothing.
pub fn follow(engine: &Engine, batch: usize, memory: Option<(MemoryModel, Budget)>, lock: crate::lockstep::Lockstep) {
    let (_tx, rx) = crate::queue::bounded::<Work>(1);
    crate::lockstep::enter(lock);
    let (stats, shutdown, hold) = (Arc::default(), Arc::default(), Arc::default());
    Scheduler::new(engine, stats, shutdown, hold, batch, memory).run(rx)
}

/// `--batch 1`: one job at a time, in arrival order.
fn run_serially(engine: Engine, rx: Inbox<Work>, stats: Arc<Stats>, shutdown: Arc<AtomicBool>, hold: Arc<Hold>) {
    loop {
        // Between jobs there is nothing to step.
        hold.idle(&stats.queued);
        hold.checkpoint();
        let work = match rx.try_recv() {
            Ok(work) => work,
            Err(TryRecvError::Disconnected) => break,
            Err(TryRecvError::Empty) => match crate::idle::wait_for_work(&rx, &stats) {
                Ok(work) => work,
                Err(_) => break,
            },
        };
        hold.checkpoint();
        let mut job = match work {
            Work::Generate(job) => *job,
            Work::Inputs(e) => {
                crate::input_job::run(&engine, e, &stats, &shutdown);
                continue;
            }
        };
        stats.queued.fetch_sub(1, Ordering::SeqCst);
        if shutdown.load(Ordering::SeqCst) {
            let _ = (job.on_event)(Event::Failed(EngineError::InvalidRequest("the server is shutting down".into())));
            continue;
        }
        crate::serial::run(&engine, job, &stats, &shutdown);
    }
}
