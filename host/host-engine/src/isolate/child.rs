//! The engine child's side of the socket: the engine runs on a local
//! [`Worker`] in this process; every job's events go to the API process,
//! and what the API process asks (submit, embed, cancel, hold) is done here.
//! When the socket closes (the API process went away), the engine stops.

use super::wire::{read_message, write_message, FailedBy, FromEngine, Hello, Refusal, ToEngine, WireEvent, WireJob};
use crate::input_job::InputJob;
use crate::job::{Event, Flow, Job};
use crate::tokenizer::TextSide;
use crate::work::SubmitError;
use crate::worker::Worker;
use std::collections::HashSet;
use std::io::{self, BufWriter, Write};
use std::os::unix::net::UnixStream;
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How often the engine's counters are sent when they changed.
const STATS_EVERY: Duration = Duration::from_millis(50);

/// Serves the API process on `stream` until it closes the socket.
pub fn serve(stream: UnixStream, hello: Hello, mut worker: Worker, text: Option<Arc<TextSide>>) -> io::Result<()> {
    let (out, rx) = channel::<FromEngine>();
    let writer = {
        let stream = stream.try_clone()?;
        std::thread::Builder::new().name("engine-writer".into()).spawn(move || write_all(stream, rx))?
    };
    out.send(FromEngine::Hello(Box::new(hello))).map_err(|_| io::Error::other("writer gone"))?;
    let worker_stats = worker.stats.clone();
    let hold_view = worker.hold_view();
    let stats_out = out.clone();
    let (stop_stats, stats_stop_rx) = channel::<()>();
    let report = move |seq: Option<u64>| FromEngine::Stats {
        seq,
        stats: worker_stats.snapshot(),
        held: hold_view.as_ref().is_some_and(|h| h.held()),
        parked: hold_view.as_ref().is_some_and(|h| h.parked()),
        mlx: [
            crate::runtime::active_memory() as u64,
            crate::runtime::cache_memory() as u64,
            crate::runtime::peak_memory() as u64,
        ],
    };
    let report = Arc::new(report);
    let pushed = report.clone();
    let stats = std::thread::Builder::new().name("engine-stats".into()).spawn(move || {
        let mut last = None;
        loop {
            let msg = pushed(None);
            let key = serde_json::to_string(&msg).unwrap_or_default();
            if last.as_ref() != Some(&key) {
                if stats_out.send(msg).is_err() {
                    return;
                }
                last = Some(key);
            }
            match stats_stop_rx.recv_timeout(STATS_EVERY) {
                Err(RecvTimeoutError::Timeout) => {}
                _ => return,
            }
        }
    })?;
    let cancelled: Arc<Mutex<HashSet<u64>>> = Arc::default();
    let mut reader = stream;
    let result = loop {
        let msg = match read_message::<ToEngine>(&mut reader) {
            Ok(Some(m)) => m,
            Ok(None) => break Ok(()),
            Err(e) => break Err(e),
        };
        match msg {
            ToEngine::Submit { seq, jobs } => {
                let refused = submit(&worker, jobs, text.as_deref(), &out, &cancelled);
                let _ = out.send(FromEngine::Submitted { seq, refused });
            }
            ToEngine::Inputs { id, inputs, task } => {
                let done = out.clone();
                let on_done = Box::new(move |r: crate::input_job::InputResult| {
                    let result = r.map_err(|e| (e.to_string(), FailedBy::of(&e)));
                    let _ = done.send(FromEngine::InputsDone { id, result });
                });
                if let Err(e) = worker.inputs(InputJob { inputs, task, on_done }) {
                    let message = match e {
                        SubmitError::Full => "the request queue is full; retry shortly",
                        _ => "the engine has stopped",
                    };
                    let _ = out.send(FromEngine::InputsDone { id, result: Err((message.into(), FailedBy::Engine)) });
                }
            }
            ToEngine::Cancel { id } => {
                cancelled.lock().unwrap_or_else(|p| p.into_inner()).insert(id);
            }
            ToEngine::Hold => worker.hold(),
            ToEngine::Release { steps } => worker.release(steps),
            ToEngine::Stats { seq } => {
                let _ = out.send(report(Some(seq)));
            }
        }
    };
    worker.shutdown();
    let _ = stop_stats.send(());
    let _ = stats.join();
    drop(out);
    let _ = writer.join();
    result
}

/// Queues one request's jobs; their events are written as they come.
fn submit(
    worker: &Worker,
    jobs: Vec<WireJob>,
    text: Option<&TextSide>,
    out: &Sender<FromEngine>,
    cancelled: &Arc<Mutex<HashSet<u64>>>,
) -> Option<Refusal> {
    let mut queued = Vec::with_capacity(jobs.len());
    for j in jobs {
        let request = match j.request.into_request(text) {
            Ok(r) => r,
            Err(message) => {
                let _ = out.send(FromEngine::Event {
                    id: j.id,
                    event: WireEvent::Failed { message, kind: FailedBy::Request },
                });
                continue;
            }
        };
        queued.push(Job { request, plan: j.plan, on_event: forward(j.id, out.clone(), cancelled.clone()) });
    }
    if queued.is_empty() {
        return None;
    }
    match worker.submit_all(queued) {
        Ok(()) => None,
        Err(SubmitError::Full) => Some(Refusal::Full),
        Err(_) => Some(Refusal::Closed),
    }
}

/// A job's callback: each event to the API process; Stop once it cancelled.
fn forward(
    id: u64,
    out: Sender<FromEngine>,
    cancelled: Arc<Mutex<HashSet<u64>>>,
) -> Box<dyn FnMut(Event) -> Flow + Send> {
    Box::new(move |ev: Event| {
        let end = matches!(ev, Event::Done(_) | Event::Failed(_));
        let event = match ev {
            Event::Token(t) => WireEvent::Token(t),
            Event::Done(r) => WireEvent::Done(r),
            Event::Failed(e) => WireEvent::Failed { kind: FailedBy::of(&e), message: e.to_string() },
        };
        if out.send(FromEngine::Event { id, event }).is_err() {
            return Flow::Stop;
        }
        let mut c = cancelled.lock().unwrap_or_else(|p| p.into_inner());
        if end {
            c.remove(&id);
            Flow::Continue
        } else if c.contains(&id) {
            Flow::Stop
        } else {
            Flow::Continue
        }
    })
}

/// Writes messages as they come, flushing when none is waiting (one
/// system call for a whole decode step's tokens).
fn write_all(stream: UnixStream, rx: Receiver<FromEngine>) {
    let mut w = BufWriter::with_capacity(1 << 16, stream);
    while let Ok(msg) = rx.recv() {
        if write_message(&mut w, &msg).is_err() {
            return;
        }
        while let Ok(more) = rx.try_recv() {
            if write_message(&mut w, &more).is_err() {
                return;
            }
        }
        if w.flush().is_err() {
            return;
        }
    }
}
