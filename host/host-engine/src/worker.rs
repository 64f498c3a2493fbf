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
use crate::embed::EmbedJob;
use crate::engine::{Engine, EngineError};
use crate::hold::Hold;
use crate::job::{Event, Job};
use crate::queue::{Inbox, Outbox, Refused};
use crate::stats::Stats;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::TryRecvError;
use std::sync::Arc;
use std::thread::JoinHandle;

/// What the queue carries.
pub enum Work {
    /// (Boxed: a job with its plan is large, an embedding job small.)
    Generate(Box<Job>),
    /// Runs whole when the engine takes it (between batch iterations).
    Embed(EmbedJob),
}

pub struct Worker {
    tx: Option<Outbox<Work>>,
    thread: Option<JoinHandle<()>>,
    pub stats: Arc<Stats>,
    /// Pauses the engine's loop between iterations (tests arrange
    /// concurrency with it; `host serve --debug-endpoints` exposes it).
    pub hold: Arc<Hold>,
    shutdown: Arc<AtomicBool>,
    /// Rank 0 of `--tp`: jobs run in lockstep with the other ranks.
    lockstep: bool,
}

#[derive(Debug)]
pub enum SubmitError {
    /// The queue holds its limit: try again later.
    Full,
    /// The worker has stopped (shutdown).
    Closed,
}

impl Worker {
    /// Starts the engine thread. `batch` rows may share a decode step
    /// (continuous batching); `batch == 1` runs strictly one job at a time.
    pub fn start(engine: Engine, queue: usize, batch: usize, memory: Option<(MemoryModel, Budget)>) -> Self {
        let (tx, rx) = crate::queue::bounded::<Work>(queue);
        let stats = Arc::new(Stats { ssd: engine.prefix().ssd_counters(), ..Stats::default() });
        let shutdown = Arc::new(AtomicBool::new(false));
        let hold = Arc::new(Hold::default());
        let (s, stop, h) = (stats.clone(), shutdown.clone(), hold.clone());
        let thread = std::thread::Builder::new()
            .name("engine".into())
            .spawn(move || {
                if batch > 1 {
                    Scheduler::new(&engine, s, stop, h, batch, memory).run(rx)
                } else {
                    run_serially(engine, rx, s, stop, h)
                }
            })
            .expect("engine thread");
        Self { tx: Some(tx), thread: Some(thread), stats, hold, shutdown, lockstep: false }
    }

    /// Rank 0 of `--tp N`: one job at a time, each one and each token's
    /// flow broadcast to the other ranks (`lockstep`).
    pub fn start_lockstep(engine: Engine, queue: usize, lock: crate::lockstep::Lockstep) -> Self {
        let (tx, rx) = crate::queue::bounded::<Work>(queue);
        let stats = Arc::new(Stats { ssd: engine.prefix().ssd_counters(), ..Stats::default() });
        let shutdown = Arc::new(AtomicBool::new(false));
        let hold = Arc::new(Hold::default());
        let (s, stop) = (stats.clone(), shutdown.clone());
        let thread = std::thread::Builder::new()
            .name("engine".into())
            .spawn(move || crate::lockstep::lead(engine, rx, s, stop, Arc::new(lock)))
            .expect("engine thread");
        Self { tx: Some(tx), thread: Some(thread), stats, hold, shutdown, lockstep: true }
    }

    /// Why this worker cannot run `req` at all (a 400 before it is queued).
    pub fn refusal(&self, req: &crate::job::GenerateRequest) -> Option<&'static str> {
        if self.lockstep {
            return crate::lockstep::refusal(req);
        }
        None
    }

    pub fn submit(&self, job: Job) -> Result<(), SubmitError> {
        self.submit_all(vec![job])
    }

    /// Queues one request's jobs (one per choice), all or none: at most
    /// `queue::MAX_GROUP`, refused only when the queue holds its limit.
    pub fn submit_all(&self, jobs: Vec<Job>) -> Result<(), SubmitError> {
        self.send(jobs.into_iter().map(|j| Work::Generate(Box::new(j))).collect())
    }

    /// Queues an embedding job (same queue, same 503 when it is full).
    pub fn embed(&self, job: EmbedJob) -> Result<(), SubmitError> {
        self.send(vec![Work::Embed(job)])
    }

    fn send(&self, work: Vec<Work>) -> Result<(), SubmitError> {
        let tx = self.tx.as_ref().ok_or(SubmitError::Closed)?;
        let n = work.len() as u64;
        self.stats.queued.fetch_add(n, Ordering::SeqCst);
        tx.send_all(work).map_err(|e| {
            self.stats.queued.fetch_sub(n, Ordering::SeqCst);
            match e {
                Refused::Full => SubmitError::Full,
                Refused::Closed => SubmitError::Closed,
            }
        })
    }

    /// Asks running and queued work to stop (each job ends within a step).
    pub fn cancel_all(&self) {
        self.shutdown.store(true, Ordering::SeqCst);
        self.hold.release();
    }

    /// Cancels running and queued work, then waits for the thread to end.
    pub fn shutdown(&mut self) {
        self.cancel_all();
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// `--batch 1`: one job at a time, in arrival order.
fn run_serially(engine: Engine, rx: Inbox<Work>, stats: Arc<Stats>, shutdown: Arc<AtomicBool>, hold: Arc<Hold>) {
    loop {
        // Between jobs there is nothing to step.
        hold.idle();
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
            Work::Embed(e) => {
                crate::embed::run(&engine, e, &stats, &shutdown);
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
