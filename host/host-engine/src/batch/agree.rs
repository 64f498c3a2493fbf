//! The scheduler's decisions that depend on what only this process sees:
//! the queue, the bytes MLX holds, the clients' answers. Alone, each is
//! made here; under `--tp` (`crate::lockstep`, this process's side) rank 0
//! makes it and every rank takes rank 0's, so all ranks run the same steps.

use super::state::Scheduler;
use crate::job::Finish;
use crate::lockstep::{self, Intake, Side};
use crate::plan::Mechanism;
use crate::queue::Inbox;
use crate::work::Work;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::TryRecvError;

impl Scheduler<'_> {
    /// The next piece of work, waiting while there is none (None: the
    /// queue ended).
    pub(super) fn wait_work(&mut self, rx: &Inbox<Work>) -> Option<Work> {
        let work = match lockstep::side() {
            None => crate::idle::wait_for_work(rx, &self.stats).ok(),
            Some(Side::Lead(lock)) => {
                crate::idle::wait_with(rx, &self.stats, |rx| lockstep::lead_wait(lock, rx, &self.stats, &self.shutdown))
            }
            Some(Side::Follow(lock)) => {
                crate::idle::wait_with(rx, &self.stats, |_| match lockstep::follow_intake(lock, self.engine, true) {
                    Intake::Work(w) => Some(w),
                    _ => None,
                })
            }
        };
        work.map(|w| self.serial_flows(w))
    }

    /// The next piece of work if one is queued now.
    pub(super) fn try_work(&mut self, rx: &Inbox<Work>) -> Intake {
        let got = match lockstep::side() {
            None => match rx.try_recv() {
                Ok(w) => Intake::Work(w),
                Err(TryRecvError::Empty) => Intake::Empty,
                Err(TryRecvError::Disconnected) => Intake::Closed,
            },
            Some(Side::Lead(lock)) => lockstep::lead_try(lock, rx, &self.stats, &self.shutdown),
            Some(Side::Follow(lock)) => lockstep::follow_intake(lock, self.engine, false),
        };
        match got {
            Intake::Work(w) => Intake::Work(self.serial_flows(w)),
            other => other,
        }
    }

    /// On rank 0, a job whose plan is serial shares each token's flow.
    fn serial_flows(&self, work: Work) -> Work {
        match (lockstep::side(), work) {
            (Some(Side::Lead(lock)), Work::Generate(job)) if job.plan.mechanism == Mechanism::Serial => {
                Work::Generate(Box::new(lockstep::lead_serial(lock.clone(), *job, self.shutdown.clone())))
            }
            (_, work) => work,
        }
    }

    /// Under `--tp`, after a batched step's tokens were handed out: the rows
    /// rank 0's clients stopped (or shutdown stopped) leave on every rank.
    /// `finished` stays in row order.
    pub(super) fn agree_stops(&mut self, keep: &mut Vec<u32>, finished: &mut Vec<(usize, Finish)>) {
        let Some(side) = lockstep::side() else { return };
        let mine: Vec<usize> =
            finished.iter().filter(|(i, _)| self.rows[*i].stopped_by_caller).map(|(i, _)| *i).collect();
        let stopped: Vec<usize> = side.agree(mine);
        if matches!(side, Side::Lead(_)) {
            return;
        }
        for i in stopped {
            self.rows[i].stopped_by_caller = true;
            if let Some(k) = keep.iter().position(|&k| k as usize == i) {
                keep.remove(k);
                finished.push((i, Finish::Stop));
            }
        }
        finished.sort_by_key(|(i, _)| *i);
    }

    /// The shutdown flag the scheduler's own checks read (admission,
    /// embeddings, serial jobs): under `--tp` one that never rises, since
    /// rank 0 refuses new work itself (`lockstep::announce`) and its rows'
    /// stops reach every rank (`agree_stops`, the serial flows).
    pub(super) fn own_shutdown(&self) -> &AtomicBool {
        static NEVER: AtomicBool = AtomicBool::new(false);
        if lockstep::side().is_some() {
            &NEVER
        } else {
            &self.shutdown
        }
    }

    /// Under `--tp` a failed batched step ends the process: the ranks could
    /// no longer run the same steps.
    pub(super) fn step_failed_in_lockstep(&self, e: &crate::error::EngineError) {
        if lockstep::side().is_some() {
            lockstep::fatal(&format!("a batched step failed: {e}"));
        }
    }

    /// Whether a finished row's state may be offered to the prefix cache:
    /// under `--tp` not after its client stopped it, since a follower may
    /// have handed out more of a speculative round's tokens before hearing
    /// of the stop, so its history differs from rank 0's.
    pub(super) fn keeps_final_state_of_stopped(&self) -> bool {
        lockstep::side().is_none()
    }
}
