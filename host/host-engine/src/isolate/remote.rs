//! The API process's side of an isolated engine: the jobs it sent, by id,
//! and the callbacks that hear their events; the engine's mirrored counters.
//! It outlives every engine child: when one dies, its jobs fail with a
//! clear error and the next child (started by the supervisor) takes new work.

use super::wire::{write_message, FromEngine, Refusal, ToEngine, WireEvent, WireJob, WireRequest};
use crate::error::EngineError;
use crate::input_job::InputJob;
use crate::job::{Event, Flow, Job};
use crate::stats::Stats;
use crate::work::SubmitError;
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
/// Times one request may be resumed: an engine that keeps dying on the
/// same request (a poisonous input) must not take the server down with it.
const MAX_RESUMES: u32 = 3;
/// How long a counters request waits before the last pushed ones are used.
const STATS_ANSWER: Duration = Duration::from_secs(2);

/// What a submission (or a counters request) heard back.
enum Answer {
    Accepted,
    Refused(Refusal),
    /// The engine process died before it answered: the jobs reached it and
    /// were failed (or orphaned for resumption) with the rest.
    EngineDied,
}

type InputsDone = Box<dyn FnOnce(crate::input_job::InputResult) + Send>;

struct Slot {
    on_event: Box<dyn FnMut(Event) -> Flow + Send>,
    /// Tokens handed to the callback (the engine may run one step past a
    /// Stop before it hears the cancel; those tokens are not delivered).
    delivered: usize,
    stopped: bool,
    /// With resumption on: the request as first sent, the tokens delivered
    /// so far (a resumed request continues after them) and its resumes.
    resume: Option<Resumable>,
}

struct Resumable {
    job: WireJob,
    tokens: Vec<u32>,
    resumes: u32,
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
    inputs: Mutex<HashMap<u64, InputsDone>>,
    answers: Mutex<HashMap<u64, Sender<Answer>>>,
    next: AtomicU64,
    pub stats: Arc<Stats>,
    mirror: Mutex<Mirror>,
    /// Resume running generations in the next engine process
    /// (`--generation-checkpoint`) instead of failing them.
    resume: bool,
    /// Jobs whose engine died, waiting for the next one.
    orphans: Mutex<Vec<Slot>>,
    /// The API asked the engine to hold: a new engine process holds too.
    hold_wanted: std::sync::atomic::AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Remote {
    /// `resume`: a generation whose engine process died continues in the
    /// next one from the tokens it had delivered.
    pub fn new(stats: Arc<Stats>, resume: bool) -> Self {
        Self {
            conn: Mutex::new(None),
            jobs: Mutex::default(),
            inputs: Mutex::default(),
            answers: Mutex::default(),
            next: AtomicU64::new(1),
            stats,
            mirror: Mutex::default(),
            resume,
            orphans: Mutex::default(),
            hold_wanted: Default::default(),
        }
    }

    pub fn mirror(&self) -> Mirror {
        *lock(&self.mirror)
    }

    pub fn connected(&self) -> bool {
        lock(&self.conn).is_some()
    }

    /// A new engine child took over (its socket's writing half).
    pub(super) fn attach(self: &Arc<Self>, stream: UnixStream) {
        *lock(&self.conn) = Some(BufWriter::new(stream));
        if self.hold_wanted.load(Ordering::SeqCst) {
            let _ = self.send(&ToEngine::Hold);
        }
        let orphans = std::mem::take(&mut *lock(&self.orphans));
        if !orphans.is_empty() {
            // Not on the caller's thread: it reads the engine's answers.
            let me = self.clone();
            std::thread::spawn(move || me.resume_all(orphans));
        }
    }

    /// Sends each orphaned job again: its prompt followed by the tokens it
    /// delivered, for the tokens it has left; the engine finds the prompt
    /// and the last checkpoint in its prefix cache's SSD tier.
    fn resume_all(&self, orphans: Vec<Slot>) {
        for mut slot in orphans {
            let Some(r) = slot.resume.as_mut() else { continue };
            r.resumes += 1;
            let mut job = r.job.clone();
            job.id = self.next.fetch_add(1, Ordering::Relaxed);
            job.request.prompt.extend_from_slice(&r.tokens);
            job.request.max_tokens -= r.tokens.len();
            job.request.resumed = r.tokens.len();
            job.request.params.resume_draws = r.tokens.len() as u64;
            tracing::info!(generated = r.tokens.len(), resumes = r.resumes, "resuming a generation");
            let id = job.id;
            lock(&self.jobs).insert(id, slot);
            if let Err(e) = self.send_jobs(vec![job], vec![id]) {
                if let Some(mut slot) = lock(&self.jobs).remove(&id) {
                    let why = format!("the engine process died and the request could not be resumed ({e:?})");
                    (slot.on_event)(Event::Failed(EngineError::Reported(why)));
                }
            }
        }
    }

    /// The engine child is gone: every job and embedding it held fails with
    /// `why`, and submissions wait for the next child.
    /// `resumable`: the jobs may wait for the next engine process (not at shutdown).
    pub(super) fn detach(&self, why: &str, resumable: bool) {
        if let Some(mut w) = lock(&self.conn).take() {
            let _ = w.get_mut().shutdown(std::net::Shutdown::Both);
        }
        for (_, tx) in lock(&self.answers).drain() {
            let _ = tx.send(Answer::EngineDied);
        }
        let mut jobs: Vec<Slot> = lock(&self.jobs).drain().map(|(_, s)| s).collect();
        if !resumable {
            jobs.append(&mut lock(&self.orphans));
        }
        for mut s in jobs {
            let again = resumable && !s.stopped && s.resume.as_ref().is_some_and(|r| r.resumes < MAX_RESUMES);
            if again {
                lock(&self.orphans).push(s);
                continue;
            }
            let why = match &s.resume {
                Some(r) if resumable && !s.stopped => {
                    format!("{why}; the request was resumed {} times and is not resumed again", r.resumes)
                }
                _ => why.to_owned(),
            };
            (s.on_event)(Event::Failed(EngineError::Reported(why)));
        }
        let inputs: Vec<_> = lock(&self.inputs).drain().map(|(_, f)| f).collect();
        for f in inputs {
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
            let wire_job = WireJob { id, request, plan: job.plan };
            let resume = self.resume.then(|| Resumable { job: wire_job.clone(), tokens: Vec::new(), resumes: 0 });
            wire.push(wire_job);
            slots.push((id, Slot { on_event: job.on_event, delivered: 0, stopped: false, resume }));
        }
        let ids: Vec<u64> = slots.iter().map(|(id, _)| *id).collect();
        lock(&self.jobs).extend(slots);
        self.send_jobs(wire, ids)
    }

    /// Sends registered jobs as one submission; on refusal they are removed.
    fn send_jobs(&self, wire: Vec<WireJob>, ids: Vec<u64>) -> Result<(), SubmitError> {
        let seq = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = channel();
        lock(&self.answers).insert(seq, tx);
        let answer = match self.send(&ToEngine::Submit { seq, jobs: wire }) {
            Ok(()) => rx.recv_timeout(SUBMIT_ANSWER).unwrap_or(Answer::Refused(Refusal::Closed)),
            Err(_) => Answer::Refused(Refusal::Closed),
        };
        lock(&self.answers).remove(&seq);
        match answer {
            // A request that kills the engine at once hears so through its
            // events (a 5xx naming the death), not as a 503 to retry.
            Answer::Accepted | Answer::EngineDied => Ok(()),
            Answer::Refused(refusal) => {
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

    pub fn inputs(&self, job: InputJob) -> Result<(), SubmitError> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        lock(&self.inputs).insert(id, job.on_done);
        self.send(&ToEngine::Inputs { id, inputs: job.inputs, task: job.task }).inspect_err(|_| {
            lock(&self.inputs).remove(&id);
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
        self.hold_wanted.store(true, Ordering::SeqCst);
        let _ = self.send(&ToEngine::Hold);
        lock(&self.mirror).held = true;
    }

    pub fn release(&self, steps: Option<u64>) {
        let _ = self.send(&ToEngine::Release { steps });
        if steps.is_none() {
            self.hold_wanted.store(false, Ordering::SeqCst);
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
                    let _ = tx.send(refused.map_or(Answer::Accepted, Answer::Refused));
                }
            }
            FromEngine::Event { id, event } => self.event(id, event),
            FromEngine::InputsDone { id, result } => {
                if let Some(f) = lock(&self.inputs).remove(&id) {
                    f(result.map_err(|(m, kind)| kind.error(m)));
                }
            }
            FromEngine::Stats { seq, stats, held, parked, mlx } => {
                self.stats.load(&stats);
                *lock(&self.mirror) = Mirror { held, parked, mlx };
                if let Some(tx) = seq.and_then(|s| lock(&self.answers).remove(&s)) {
                    let _ = tx.send(Answer::Accepted);
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
                if let Some(r) = slot.resume.as_mut() {
                    r.tokens.push(t.id);
                }
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
                if let Some(first) = slot.resume.as_ref().filter(|s| s.resumes > 0) {
                    // A resumed run: the answer covers the request as first sent.
                    r.tokens = first.tokens.clone();
                    r.prompt_tokens = first.job.request.prompt.len();
                    r.cached_tokens = r.cached_tokens.min(r.prompt_tokens);
                }
                (slot.on_event)(Event::Done(r));
            }
            WireEvent::Failed { message, kind } => {
                let Some(mut slot) = jobs.remove(&id) else { return };
                drop(jobs);
                (slot.on_event)(Event::Failed(kind.error(message)));
            }
        }
    }
}
