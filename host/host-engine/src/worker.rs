//! One thread owns the engine and runs requests in arrival order; callers
//! submit jobs (generation, or embeddings) to a bounded queue and hear back
//! through a callback. MLX work for the served model therefore never runs
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
use crate::stats::Stats;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TryRecvError, TrySendError};
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
    tx: Option<SyncSender<Work>>,
    thread: Option<JoinHandle<()>>,
    pub stats: Arc<Stats>,
    /// Pauses the engine's loop between iterations (tests arrange
    /// concurrency with it; `host serve --debug-endpoints` exposes it).
    pub hold: Arc<Hold>,
    shutdown: Arc<AtomicBool>,
}

#[derive(Debug)]
pub enum SubmitError {
    /// The queue is full: try again later.
    Full,
    /// The worker has stopped (shutdown).
    Closed,
}

impl Worker {
    /// Starts the engine thread. `batch` rows may share a decode step
    /// (continuous batching); `batch == 1` runs strictly one job at a time.
    pub fn start(engine: Engine, queue: usize, batch: usize, memory: Option<(MemoryModel, Budget)>) -> Self {
        let (tx, rx) = sync_channel::<Work>(queue.max(1));
        let stats = Arc::new(Stats::default());
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
        Self { tx: Some(tx), thread: Some(thread), stats, hold, shutdown }
    }

    pub fn submit(&self, job: Job) -> Result<(), SubmitError> {
        self.send(Work::Generate(Box::new(job)))
    }

    /// Queues an embedding job (same queue, same 503 when it is full).
    pub fn embed(&self, job: EmbedJob) -> Result<(), SubmitError> {
        self.send(Work::Embed(job))
    }

    fn send(&self, work: Work) -> Result<(), SubmitError> {
        let tx = self.tx.as_ref().ok_or(SubmitError::Closed)?;
        self.stats.queued.fetch_add(1, Ordering::SeqCst);
        tx.try_send(work).map_err(|e| {
            self.stats.queued.fetch_sub(1, Ordering::SeqCst);
            match e {
                TrySendError::Full(_) => SubmitError::Full,
                TrySendError::Disconnected(_) => SubmitError::Closed,
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
fn run_serially(engine: Engine, rx: Receiver<Work>, stats: Arc<Stats>, shutdown: Arc<AtomicBool>, hold: Arc<Hold>) {
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
