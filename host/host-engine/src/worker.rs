//! One thread owns the engine and runs requests in arrival order; callers
//! submit jobs to a bounded queue and hear back through a callback. MLX
//! work for the served model therefore never runs on two threads at once.
//!
//! Cancellation: the callback returns `Flow::Stop` (client gone, stop string
//! matched, shutdown), which the decode loop honours after the current step:
//! a cancelled request stops within one decode step and its caches are freed
//! with the job.

use crate::engine::{Engine, EngineError};
use crate::generate::{Finish, Flow, GenerateRequest, GenerateResult, TokenOut};
use crate::histogram::{Histogram, TOKENS_PER_SECOND, TTFT_SECONDS};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;

/// What a job reports, in order: tokens, then exactly one `Done` or `Failed`.
pub enum Event {
    Token(TokenOut),
    Done(GenerateResult),
    Failed(EngineError),
}

pub struct Job {
    pub request: GenerateRequest,
    /// Called for every event; returning `Flow::Stop` cancels the job.
    pub on_event: Box<dyn FnMut(Event) -> Flow + Send>,
}

/// Counters for observability (and for tests that watch cancellation).
#[derive(Default)]
pub struct Stats {
    pub queued: AtomicU64,
    pub active: AtomicU64,
    pub requests: AtomicU64,
    pub completed: AtomicU64,
    /// Jobs stopped by their caller (client gone, stop string, shutdown).
    pub cancelled: AtomicU64,
    pub failed: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub generated_tokens: AtomicU64,
    /// Tokens the most recently cancelled job had produced when it stopped.
    pub last_cancelled_tokens: AtomicU64,
    /// Decode steps run, and the most rows any one of them carried.
    pub decode_steps: AtomicU64,
    pub max_batch_rows: AtomicU64,
    /// Batched speculative rounds whose rollback replayed the kept tokens
    /// (recurrent state), and those among them whose rows kept different
    /// counts (replayed with per-row padding).
    pub spec_replays: AtomicU64,
    pub spec_replays_padded: AtomicU64,
    /// Cohort prefills run, and the rows they carried.
    pub cohorts: AtomicU64,
    pub cohort_rows: AtomicU64,
    /// Per-request time to first token (seconds), prefill rate (prompt
    /// tokens / time to first token) and decode rate (tokens/s after the
    /// first), as histograms; the last finished request's rates as gauges.
    pub ttft: Histogram,
    pub prefill_rate: Histogram,
    pub decode_rate: Histogram,
    pub last_prefill_tps: AtomicU64,
    pub last_decode_tps: AtomicU64,
    /// Prefix cache counters, copied from the engine after each request.
    pub prefix_hits: AtomicU64,
    pub prefix_misses: AtomicU64,
    pub prefix_hit_tokens: AtomicU64,
    pub prefix_bytes: AtomicU64,
    pub prefix_entries: AtomicU64,
    /// Requests refused because they can never fit in memory.
    pub admission_refusals: AtomicU64,
}

impl Stats {
    /// Records a finished request's timings and the engine's cache counters.
    pub(crate) fn record(&self, r: &GenerateResult, engine: &Engine) {
        self.ttft.observe(TTFT_SECONDS, r.prefill_s);
        self.prefill_rate.observe(TOKENS_PER_SECOND, r.prefill_tps());
        if r.tokens.len() >= 2 {
            self.decode_rate.observe(TOKENS_PER_SECOND, r.decode_tps());
        }
        self.last_prefill_tps.store(r.prefill_tps().to_bits(), Ordering::Relaxed);
        self.last_decode_tps.store(r.decode_tps().to_bits(), Ordering::Relaxed);
        self.sync_prefix(engine);
    }

    /// Copies the engine's prefix-cache counters.
    pub(crate) fn sync_prefix(&self, engine: &Engine) {
        let c = engine.prefix_counters();
        self.prefix_hits.store(c.hits, Ordering::Relaxed);
        self.prefix_misses.store(c.misses, Ordering::Relaxed);
        self.prefix_hit_tokens.store(c.hit_tokens, Ordering::Relaxed);
        self.prefix_bytes.store(c.bytes, Ordering::Relaxed);
        self.prefix_entries.store(c.entries, Ordering::Relaxed);
    }
}

pub struct Worker {
    tx: Option<SyncSender<Job>>,
    thread: Option<JoinHandle<()>>,
    pub stats: Arc<Stats>,
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
    pub fn start(
        engine: Engine,
        queue: usize,
        batch: usize,
        memory: Option<(crate::admission::MemoryModel, crate::admission::Budget)>,
    ) -> Self {
        let (tx, rx) = sync_channel::<Job>(queue.max(1));
        let stats = Arc::new(Stats::default());
        let shutdown = Arc::new(AtomicBool::new(false));
        let (s, stop) = (stats.clone(), shutdown.clone());
        let thread = std::thread::Builder::new()
            .name("engine".into())
            .spawn(move || {
                if batch > 1 {
                    crate::scheduler::Scheduler::new(&engine, s, stop, batch, memory).run(rx)
                } else {
                    run(engine, rx, s, stop)
                }
            })
            .expect("engine thread");
        Self { tx: Some(tx), thread: Some(thread), stats, shutdown }
    }

    pub fn submit(&self, job: Job) -> Result<(), SubmitError> {
        let tx = self.tx.as_ref().ok_or(SubmitError::Closed)?;
        self.stats.queued.fetch_add(1, Ordering::SeqCst);
        tx.try_send(job).map_err(|e| {
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

fn run(engine: Engine, rx: Receiver<Job>, stats: Arc<Stats>, shutdown: Arc<AtomicBool>) {
    loop {
        let mut job = match rx.try_recv() {
            Ok(job) => job,
            Err(std::sync::mpsc::TryRecvError::Disconnected) => break,
            Err(std::sync::mpsc::TryRecvError::Empty) => {
                // Between requests, with nothing queued: freed buffers go back.
                crate::runtime::clear_cache();
                match rx.recv() {
                    Ok(job) => job,
                    Err(_) => break,
                }
            }
        };
        stats.queued.fetch_sub(1, Ordering::SeqCst);
        if shutdown.load(Ordering::SeqCst) {
            let _ = (job.on_event)(Event::Failed(EngineError::InvalidRequest("the server is shutting down".into())));
            continue;
        }
        run_one(&engine, job, &stats, &shutdown);
    }
}

/// Runs one job alone with the serial (pipelined) decode loop.
pub(crate) fn run_one(engine: &Engine, mut job: Job, stats: &Stats, shutdown: &AtomicBool) {
    stats.requests.fetch_add(1, Ordering::SeqCst);
    stats.active.fetch_add(1, Ordering::SeqCst);
    stats.prompt_tokens.fetch_add(job.request.prompt.len() as u64, Ordering::SeqCst);
    let mut produced = 0u64;
    let mut stopped_by_caller = false;
    let result = engine.generate(&job.request, |t| {
        produced += 1;
        stats.generated_tokens.fetch_add(1, Ordering::SeqCst);
        let flow = (job.on_event)(Event::Token(TokenOut { id: t.id, logprob: t.logprob, top: t.top.clone() }));
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
