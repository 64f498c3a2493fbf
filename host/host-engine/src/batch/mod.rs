//! Continuous batching: requests join a running batch between decode steps
//! and leave it independently.
//!
//! Each iteration of the loop (one "safe unit" of work):
//! 1. admit queued jobs up to the batch limit (`admit`: a job whose plan is
//!    serial waits until the batch drains, then runs alone, so serial and
//!    batched work never share the device; a job that does not fit memory
//!    beside the running rows waits for rows to finish);
//! 2. advance prefill by one chunk (`joining`: a cohort of new requests
//!    together, or one joiner), and merge rows whose prompt is in;
//! 3. one decode step over every row (`step`; a speculative round when some
//!    row drafted, `spec_round`), then finished or cancelled rows leave
//!    (`emit`).
//!
//! A row's tokens are computed as in the serial loop: its prompt minus the
//! last token is prefilled, then the last token produces the first logits.

mod admit;
mod agree;
mod ahead;
mod cohort;
mod emit;
mod joining;
mod row_spec;
mod spec_round;
mod state;
mod step;

pub use state::Scheduler;

use crate::error::EngineError;
use crate::job::Event;
use crate::lockstep::Intake;
use crate::work::Work;
use std::sync::atomic::Ordering;

impl Scheduler<'_> {
    /// Runs until the queue is closed and all work is done.
    pub fn run(mut self, rx: crate::queue::Inbox<Work>) {
        let mut open = true;
        loop {
            if self.idle() {
                self.hold.idle(&self.stats.queued);
            }
            self.stats.sync_pool(self.engine);
            self.hold.checkpoint();
            if self.idle() {
                if !open {
                    return;
                }
                self.steps_since_clear = 0;
                match self.wait_work(&rx) {
                    Some(work) => {
                        self.hold.checkpoint();
                        self.receive(work)
                    }
                    None => return,
                }
            }
            if let Some(job) = self.waiting.take() {
                if self.fits(&job) {
                    self.start(job);
                } else {
                    self.waiting = Some(job);
                }
            }
            while open
                && self.serial_next.is_none()
                && self.waiting.is_none()
                && self.rows.len() + self.joining.len() + self.cohort_rows() < self.limit
            {
                match self.try_work(&rx) {
                    Intake::Work(work) => self.receive(work),
                    Intake::Empty => break,
                    Intake::Closed => open = false,
                }
            }
            if self.rows.is_empty() && self.joining.is_empty() && self.cohort.is_none() {
                if let Some(job) = self.serial_next.take() {
                    crate::serial::run(self.engine, job, &self.stats, self.own_shutdown());
                }
                continue;
            }
            // A joiner that fails is answered with its error; the batch goes on.
            let t = std::time::Instant::now();
            let joiners = self.joining.len() + self.cohort_rows();
            self.advance_joiner();
            if joiners > 0 {
                tracing::trace!(
                    target: "host_engine::batch",
                    joiners,
                    rows = self.rows.len(),
                    ms = t.elapsed().as_secs_f64() * 1e3,
                    "prefill chunk"
                );
            }
            self.bound_prefix_cache();
            if !self.rows.is_empty() {
                let ticket = self.hold.begin_step();
                if let Err(e) = self.step() {
                    self.fail_rows(&e);
                }
                self.hold.stepped(ticket);
            }
        }
    }

    /// A failed batch step fails every row in it (joiners stay).
    fn fail_rows(&mut self, e: &EngineError) {
        self.step_failed_in_lockstep(e);
        for mut r in self.rows.drain(..) {
            self.stats.active.fetch_sub(1, Ordering::SeqCst);
            self.stats.failed.fetch_add(1, Ordering::SeqCst);
            let _ = (r.job.on_event)(Event::Failed(EngineError::Model(e.to_string())));
        }
        self.batch = None;
        self.ahead = None;
    }

    /// `settle`, failing the rows when reading the queued step fails.
    pub(super) fn settle_or_fail(&mut self) {
        if let Err(e) = self.settle() {
            self.fail_rows(&e);
        }
    }

    /// A generation job joins (or waits); a whole-input job runs now, between
    /// iterations, beside the rows it leaves untouched.
    fn receive(&mut self, work: Work) {
        match work {
            Work::Generate(job) => self.admit(*job),
            Work::Inputs(e) => crate::input_job::run(self.engine, e, &self.stats, self.own_shutdown()),
        }
    }
}
