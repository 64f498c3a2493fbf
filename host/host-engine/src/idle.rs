//! What the engine's loop does between requests, batched or serial.

use crate::queue::Inbox;
use crate::stats::Stats;
use std::sync::atomic::Ordering;
use std::sync::mpsc::RecvError;

/// With nothing queued: the work still on the device (a step built ahead
/// for rows that all finished) runs out, freed buffers go back (mlx-lm
/// clears its buffer cache between requests too), `stats.idle` says so
/// while the loop waits for the next piece of work.
pub(crate) fn wait_for_work<T>(rx: &Inbox<T>, stats: &Stats) -> Result<T, RecvError> {
    wait_with(rx, stats, |rx| rx.recv())
}

/// `wait_for_work` with the wait itself given (`lockstep` waits in ticks).
pub(crate) fn wait_with<T, R>(rx: &Inbox<T>, stats: &Stats, wait: impl FnOnce(&Inbox<T>) -> R) -> R {
    crate::runtime::wait_for_streams();
    crate::runtime::clear_cache();
    // No row, joiner or cohort: nothing holds K/V for a request.
    stats.kv_reserved.store(0, Ordering::SeqCst);
    stats.idle.store(true, Ordering::SeqCst);
    let work = wait(rx);
    stats.idle.store(false, Ordering::SeqCst);
    work
}
