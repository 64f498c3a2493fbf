//! The API process's side of an isolated engine: the jobs it sent, by id,
//! and the callbacks that hear their events; the engine's mirrored counters.
//! It outlives every engine child: when one dies, its jobs fail with a
//! clear error and the next child (started by the supervisor) takes new work.

use super::wire::{write_message, FromEngine, Refusal, ToEngine, WireEvent, WireJob, WireRequest};
use crate::embed::EmbedJob;
use crate::engine::EngineError;
use crate::job::{Event, Flow, Job};
use crate::stats::Stats;
use crate::worker::SubmitError;
use std::collections::HashMap;
use std::io::{BufWriter, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// How long a submission waits for the engine's answer before it counts as
/// refused (the engine answers at once unless it is dying).
const SUBMIT_ANSWER: Duration = Duration::from_secs(30);
/// How long a counters request waits before the last pushed ones are used.
const STATS_ANSWER: Duration = Duration::from_secs(2);

type EmbedDone = Box<dyn FnOnce(crate::embed::Embeddings) + Send>;

struct Slot {
    on_event: Box<dyn FnMut(Event) -> Flow + Send>,
    /// Tokens handed to the callback (the engine may run one step past a
    /// Stop before it hears the cancel; those tokens are not delivered).
    delivered: usize,
    stopped: bool,
}

/// What the engine last reported besides its counters.
#[derive(Debug, Clone, Copy, Default)]
pub struct Mirror {
    pub held: bool,
    pub parked: bool,
    /// MLX's active, cache and peak bytes in the engine process.
    pub mlx: [u64; 3],
}

pub struct Remote {
    conn: Mutex<Option<BufWriter<UnixStream>>>,
    jobs: Mutex<HashMap<u64, Slot>>,
    embeds: Mutex<HashMap<u64, EmbedDone>>,
    answers: Mutex<HashMap<u64, Sender<Option<Refusal>>>>,
    next: AtomicU64,
    pub stats: Arc<Stats>,
    mirror: Mutex<Mirror>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Remote {
    pub fn new(stats: Arc<Stats>) -> Self {
        Self {
            conn: Mutex::new(None),
            jobs: Mutex::default(),
            embeds: Mutex::default(),
            answers: Mutex::default(),
            next: AtomicU64::new(1),
            stats,
            mirror: Mutex::default(),
        }
    }

    pub fn mirror(&self) -> Mirror {
        *lock(&self.mirror)
    }

    pub fn connected(&self) -> bool {
        lock(&self.conn).is_some()
    }

    /// A new engine child took over (its socket's writing half).
    pub(super) fn attach(&self, stream: UnixStream) {
        *lock(&self.conn) = Some(BufWriter::new(stream));
    }

    /// The engine child is gone: every job and embedding it held fails with
    /// `why`, and submissions wait for the next child.
    pub(super) fn detach(&self, why: &str) {
        if let Some(mut w) = lock(&self.conn).take() {
            let _ = w.get_mut().shutdown(std::net::Shutdown::Both);
        }
        lock(&self.answers).clear();
        let jobs: Vec<Slot> = lock(&self.jobs).drain().map(|(_, s)| s).collect();
        for mut s in jobs {
            (s.on_event)(Event::Failed(EngineError::Reported(why.to_owned())));
        }
        let embeds: Vec<_> = lock(&self.embeds).drain().map(|(_, f)| f).collect();
        for f in embeds {
            f(Err(EngineError::Reported(why.to_owned())));
        }
        let mut m = lock(&self.mirror);
        m.held = false;
        m.parked = false;
        self.stats.queued.store(0, Ordering::Relaxed);
        self.stats.active.store(0, Ordering::Relaxed);
        self.stats.kv_reserved.store(0, Ordering::Relaxed);
    }

    fn send(&self, msg: &ToEngine) -> Result<(), SubmitError> {
        let mut conn = lock(&self.conn);
        let w = conn.as_mut().ok_or(SubmitError::Restarting)?;
        write_message(w, msg).and_then(|_| w.flush()).map_err(|_| SubmitError::Restarting)
    }

    pub fn submit_all(&self, jobs: Vec<Job>) -> Result<(), SubmitError> {
        if !self.connected() {
            return Err(SubmitError::Restarting);
        }
        let mut wire = Vec::with_capacity(jobs.len());
        let mut slots = Vec::with_capacity(jobs.len());
        for job in jobs {
            let request = WireRequest::from_request(&job.request).ok_or(SubmitError::Closed)?;
            let id = self.next.fetch_add(1, Ordering::Relaxed);
            wire.push(WireJob { id, request, plan: job.plan });
            slots.push((id, Slot { on_event: job.on_event, delivered: 0, stopped: false }));
        }
        let ids: Vec<u64> = slots.iter().map(|(id, _)| *id).collect();
        lock(&self.jobs).extend(slots);
        let seq = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = channel();
        lock(&self.answers).insert(seq, tx);
        let answer = match self.send(&ToEngine::Submit { seq, jobs: wire }) {
            Ok(()) => rx.recv_timeout(SUBMIT_ANSWER).unwrap_or(Some(Refusal::Closed)),
            Err(_) => Some(Refusal::Closed),
        };
        lock(&self.answers).remove(&seq);
        match answer {
            None => Ok(()),
            Some(refusal) => {
                let mut jobs = lock(&self.jobs);
                for id in ids {
                    jobs.remove(&id);
                }
                Err(match refusal {
                    Refusal::Full => SubmitError::Full,
                    Refusal::Closed => SubmitError::Restarting,
                })
            }
        }
    }

    pub fn embed(&self, job: EmbedJob) -> Result<(), SubmitError> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        lock(&self.embeds).insert(id, job.on_done);
        self.send(&ToEngine::Embed { id, inputs: job.inputs }).inspect_err(|_| {
            lock(&self.embeds).remove(&id);
        })
    }

    /// Asks the engine for its counters and waits for them (a little), so
    /// that what a caller reads next is as fresh as in a local engine.
    pub fn refresh(&self) {
        let seq = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = channel();
        lock(&self.answers).insert(seq, tx);
        if self.send(&ToEngine::Stats { seq }).is_ok() {
            let _ = rx.recv_timeout(STATS_ANSWER);
        }
        lock(&self.answers).remove(&seq);
    }

    pub fn hold(&self) {
        let _ = self.send(&ToEngine::Hold);
        lock(&self.mirror).held = true;
    }

    pub fn release(&self, steps: Option<u64>) {
        let _ = self.send(&ToEngine::Release { steps });
        if steps.is_none() {
            lock(&self.mirror).held = false;
        }
    }

    /// Every running and queued job stops listening (shutdown).
    pub fn cancel_all(&self) {
        let ids: Vec<u64> = lock(&self.jobs).keys().copied().collect();
        for id in ids {
            let _ = self.send(&ToEngine::Cancel { id });
        }
    }

    /// One message from the engine child.
    pub(super) fn dispatch(&self, msg: FromEngine) {
        match msg {
            FromEngine::Hello(_) => {}
            FromEngine::Submitted { seq, refused } => {
                if let Some(tx) = lock(&self.answers).remove(&seq) {
                    let _ = tx.send(refused);
                }
            }
            FromEngine::Event { id, event } => self.event(id, event),
            FromEngine::Embedded { id, result } => {
                if let Some(f) = lock(&self.embeds).remove(&id) {
                    f(result.map_err(|(m, invalid)| error(m, invalid)));
                }
            }
            FromEngine::Stats { seq, stats, held, parked, mlx } => {
                self.stats.load(&stats);
                *lock(&self.mirror) = Mirror { held, parked, mlx };
                if let Some(tx) = seq.and_then(|s| lock(&self.answers).remove(&s)) {
                    let _ = tx.send(None);
                }
            }
        }
    }

    fn event(&self, id: u64, event: WireEvent) {
        let mut jobs = lock(&self.jobs);
        match event {
            WireEvent::Token(t) => {
                let Some(slot) = jobs.get_mut(&id) else { return };
                if slot.stopped {
                    return;
                }
                slot.delivered += 1;
                if (slot.on_event)(Event::Token(t)) == Flow::Stop {
                    slot.stopped = true;
                    drop(jobs);
                    let _ = self.send(&ToEngine::Cancel { id });
                }
            }
            WireEvent::Done(mut r) => {
                let Some(mut slot) = jobs.remove(&id) else { return };
                drop(jobs);
                if slot.stopped {
                    r.tokens.truncate(slot.delivered);
                }
                (slot.on_event)(Event::Done(r));
            }
            WireEvent::Failed { message, invalid } => {
                let Some(mut slot) = jobs.remove(&id) else { return };
                drop(jobs);
                (slot.on_event)(Event::Failed(error(message, invalid)));
            }
        }
    }
}

fn error(message: String, invalid: bool) -> EngineError {
    if invalid {
        EngineError::InvalidRequest(message)
    } else {
        EngineError::Reported(message)
    }
}
