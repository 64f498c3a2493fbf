//! A hold on the engine's loop, so tests (and operators pausing a server)
//! arrange concurrency exactly instead of by timing: while held, the
//! engine takes no job from its queue and runs no step; `release_for(n)`
//! lets it run n more decode steps and then holds it again.
//!
//! The loop calls `checkpoint` between iterations; `parked` says it is
//! waiting there, so a caller can wait for the hold to take effect.
//!
//! A window counts only the steps that begin inside it: the loop can be
//! between a step and its `stepped` when a caller opens a window (it saw
//! that step's row finish, and queued the next job), and that step is not
//! one of the n.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};

#[derive(Default)]
struct State {
    held: bool,
    /// Decode steps left before the loop holds itself again.
    steps_left: Option<u64>,
    /// The loop is waiting at a checkpoint.
    parked: bool,
    /// Which release window is open (each `release_for` opens a new one).
    window: u64,
}

/// The release window a decode step began in (`Hold::begin_step`).
#[derive(Clone, Copy)]
pub(crate) struct StepTicket(u64);

#[derive(Default)]
pub struct Hold {
    state: Mutex<State>,
    wake: Condvar,
}

impl Hold {
    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let out = f(&mut s);
        self.wake.notify_all();
        out
    }

    /// Holds the loop at its next checkpoint.
    pub fn hold(&self) {
        self.with(|s| {
            s.held = true;
            s.steps_left = None;
        });
    }

    /// Lets the loop run freely.
    pub fn release(&self) {
        self.with(|s| {
            s.held = false;
            s.steps_left = None;
        });
    }

    /// Lets the loop run `steps` more decode steps, then holds it again.
    pub fn release_for(&self, steps: u64) {
        self.with(|s| {
            s.held = steps == 0;
            s.steps_left = (steps > 0).then_some(steps);
            s.window += 1;
        });
    }

    /// Whether the loop is waiting at a checkpoint now.
    pub fn parked(&self) -> bool {
        self.state.lock().map(|s| s.parked).unwrap_or(false)
    }

    /// Whether a hold is in force (the loop may not have reached it yet).
    pub fn held(&self) -> bool {
        self.state.lock().map(|s| s.held).unwrap_or(false)
    }

    /// Called by the loop between iterations: waits while held.
    pub(crate) fn checkpoint(&self) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if !s.held {
            return;
        }
        s.parked = true;
        self.wake.notify_all();
        while s.held {
            s = self.wake.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        s.parked = false;
    }

    /// Called by the loop when it has nothing to step: a `release_for`
    /// window ends there too (the steps it allowed cannot happen), so a
    /// caller waiting for the loop to hold again is not left waiting. But
    /// not while `queued` says work is on its way: a caller counts a job
    /// as queued before it releases the loop for it, and the loop may reach
    /// this point between the two, before it has looked at its queue.
    /// (`queued` is read under the hold's lock, which `release_for` takes:
    /// a window opened for a queued job always sees it queued here.)
    pub(crate) fn idle(&self, queued: &AtomicU64) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if queued.load(Ordering::SeqCst) == 0 && s.steps_left.take().is_some() {
            s.held = true;
        }
    }

    /// Called by the loop before each decode step; its ticket goes to
    /// `stepped` after it.
    pub(crate) fn begin_step(&self) -> StepTicket {
        StepTicket(self.state.lock().unwrap_or_else(|p| p.into_inner()).window)
    }

    /// Called by the loop after each decode step: a step that began before
    /// the window now open does not count against it.
    pub(crate) fn stepped(&self, step: StepTicket) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if step.0 != s.window {
            return;
        }
        if let Some(n) = s.steps_left {
            s.steps_left = n.checked_sub(1).filter(|&n| n > 0);
            s.held = s.steps_left.is_none();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Hold;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    #[test]
    fn a_held_loop_parks_until_released_and_release_for_counts_steps() {
        let hold = Arc::new(Hold::default());
        hold.hold();
        let h = hold.clone();
        let loop_thread = std::thread::spawn(move || {
            h.checkpoint();
            for _ in 0..3 {
                h.stepped(h.begin_step());
            }
            h.checkpoint();
        });
        while !hold.parked() {
            std::thread::yield_now();
        }
        hold.release_for(3);
        while !(hold.parked() && hold.held()) {
            std::thread::yield_now();
        }
        hold.release();
        loop_thread.join().unwrap();
        assert!(!hold.parked() && !hold.held());
    }

    /// A window opened for a job already counted as queued survives the
    /// loop finding itself idle before it looked at its queue; with nothing
    /// queued, idling ends the window.
    #[test]
    fn idling_ends_a_release_window_only_when_nothing_is_queued() {
        let hold = Hold::default();
        let queued = AtomicU64::new(1);
        hold.hold();
        hold.release_for(3);
        hold.idle(&queued);
        assert!(!hold.held(), "the window ended with a job queued for it");
        hold.stepped(hold.begin_step());
        queued.store(0, Ordering::SeqCst);
        hold.idle(&queued);
        assert!(hold.held(), "an idle loop with nothing queued kept its window");
    }

    /// A step that was under way when the window opened (its row's end
    /// already answered, the next job queued) uses none of the window.
    #[test]
    fn a_step_begun_before_the_window_opened_does_not_count_against_it() {
        let hold = Hold::default();
        let under_way = hold.begin_step();
        hold.hold();
        hold.release_for(1);
        hold.stepped(under_way);
        assert!(!hold.held(), "the step begun before the window used it up");
        hold.stepped(hold.begin_step());
        assert!(hold.held(), "the window's own step did not end it");
    }
}
