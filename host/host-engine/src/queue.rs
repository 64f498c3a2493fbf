//! The bounded queue between request handlers and the engine thread. It
//! counts what it holds itself, so that the jobs of one request (one per
//! choice of `n`) go in together or not at all: a request is refused only
//! when the queue already holds its limit, and then none of its jobs is
//! queued. (A plain bounded channel of the limit refused a lone request
//! with more choices than the limit, or not, depending on how fast the
//! engine drained the first ones.)

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvError, SyncSender, TryRecvError, TrySendError};
use std::sync::{Arc, Mutex};

/// The most jobs one request queues together (`n` is at most this).
pub const MAX_GROUP: usize = 128;

/// Why nothing was queued.
#[derive(Debug, PartialEq)]
pub enum Refused {
    /// The queue holds its limit already: try again later.
    Full,
    /// The engine has stopped taking work.
    Closed,
}

/// A queue that refuses new groups once `limit` items wait in it.
pub fn bounded<T>(limit: usize) -> (Outbox<T>, Inbox<T>) {
    let limit = limit.max(1);
    // Room for a whole group sent while fewer than `limit` items wait.
    let (tx, rx) = sync_channel(limit + MAX_GROUP - 1);
    let held = Arc::new(AtomicUsize::new(0));
    let turn = Arc::new(Mutex::new(()));
    (Outbox { tx, held: held.clone(), limit, one_at_a_time: turn.clone() }, Inbox { rx, held, turn })
}

pub struct Outbox<T> {
    tx: SyncSender<T>,
    held: Arc<AtomicUsize>,
    limit: usize,
    /// Senders check the room and send as one step; the engine's end waits
    /// for a group being sent, so that it sees a group whole.
    one_at_a_time: Arc<Mutex<()>>,
}

impl<T> Outbox<T> {
    /// Queues every item, or none when the queue already holds its limit
    /// (or `items` is larger than a group may be). The items it queues are
    /// added to `counted` first, within the turn, before the engine can take
    /// any: a count that reached n means n items passed the room check, and
    /// a later sender finds the room they took (the caller's view, e.g.
    /// /stats' `queued`, never runs ahead of the queue).
    pub fn send_all(&self, items: Vec<T>, counted: &AtomicU64) -> Result<(), Refused> {
        let _turn = self.one_at_a_time.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if items.len() > MAX_GROUP || self.held.load(Ordering::SeqCst) >= self.limit {
            return Err(Refused::Full);
        }
        let mut left = items.len() as u64;
        counted.fetch_add(left, Ordering::SeqCst);
        for item in items {
            self.held.fetch_add(1, Ordering::SeqCst);
            // Only the engine takes items out while the turn is held, so
            // the room checked above is still there.
            self.tx.try_send(item).map_err(|e| {
                self.held.fetch_sub(1, Ordering::SeqCst);
                counted.fetch_sub(left, Ordering::SeqCst);
                match e {
                    TrySendError::Full(_) => Refused::Full,
                    TrySendError::Disconnected(_) => Refused::Closed,
                }
            })?;
            left -= 1;
        }
        Ok(())
    }
}

/// The engine's end.
pub struct Inbox<T> {
    rx: Receiver<T>,
    held: Arc<AtomicUsize>,
    turn: Arc<Mutex<()>>,
}

impl<T> Inbox<T> {
    pub fn recv(&self) -> Result<T, RecvError> {
        let item = self.rx.recv()?;
        Ok(self.taken(item))
    }

    pub fn recv_timeout(&self, wait: std::time::Duration) -> Result<T, std::sync::mpsc::RecvTimeoutError> {
        let item = self.rx.recv_timeout(wait)?;
        Ok(self.taken(item))
    }

    pub fn try_recv(&self) -> Result<T, TryRecvError> {
        let item = self.rx.try_recv()?;
        Ok(self.taken(item))
    }

    /// An item is out: once the group it came with is all in (its sender
    /// never waits on this end while sending), the engine's next
    /// `try_recv` sees the rest of it: the choices of one request arrive
    /// together (one cohort), not split by the moment the engine looked.
    fn taken(&self, item: T) -> T {
        self.held.fetch_sub(1, Ordering::SeqCst);
        drop(self.turn.lock().unwrap_or_else(|poisoned| poisoned.into_inner()));
        item
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_larger_than_the_limit_goes_in_whole_when_the_queue_has_room() {
        let (tx, rx) = bounded::<usize>(2);
        let n = AtomicU64::new(0);
        assert_eq!(tx.send_all((0..MAX_GROUP).collect(), &n), Ok(()));
        // The queue holds its limit (and more): the next group is refused whole.
        assert_eq!(tx.send_all(vec![1], &n), Err(Refused::Full));
        for i in 0..MAX_GROUP - 1 {
            assert_eq!(rx.try_recv(), Ok(i));
        }
        // One item waits: below the limit of 2, so a group fits again.
        assert_eq!(tx.send_all(vec![7, 8], &n), Ok(()));
        assert_eq!(tx.send_all(vec![9], &n), Err(Refused::Full));
        assert_eq!((rx.try_recv(), rx.try_recv(), rx.try_recv()), (Ok(MAX_GROUP - 1), Ok(7), Ok(8)));
        assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
        assert_eq!(tx.send_all(vec![0; MAX_GROUP + 1], &n), Err(Refused::Full), "past a group's size");
        // Counted: every item queued, none of those refused.
        assert_eq!(n.load(Ordering::SeqCst), MAX_GROUP as u64 + 2);
    }

    #[test]
    fn single_items_are_refused_at_the_limit_as_a_channel_of_that_size_would() {
        let (tx, rx) = bounded::<u8>(1);
        let n = AtomicU64::new(0);
        assert_eq!(tx.send_all(vec![1], &n), Ok(()));
        assert_eq!(tx.send_all(vec![2], &n), Err(Refused::Full));
        assert_eq!(rx.recv(), Ok(1));
        assert_eq!(tx.send_all(vec![3], &n), Ok(()));
        assert_eq!(rx.recv(), Ok(3));
        drop(rx);
        assert_eq!(tx.send_all(vec![4], &n), Err(Refused::Closed));
        assert_eq!(n.load(Ordering::SeqCst), 2, "the refused and the unsent are not counted");
    }
}
