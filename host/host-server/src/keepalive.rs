//! SSE keep-alive: a stream that has sent nothing for a while (a long
//! prefill, a wait in the queue, text held back for stop strings or
//! tool-call syntax) sends a comment (Anthropic's streams: a `ping`
//! event), which SSE clients skip and proxies and load balancers count as
//! traffic, so an idle-timeout does not cut a request that is still being
//! worked on. Every streaming API times its silences here
//! (`--sse-keepalive`).

use tokio::sync::mpsc::UnboundedReceiver;
use tokio::time::{Duration, Instant};

/// An SSE comment line.
pub const COMMENT: &[u8] = b": keep-alive\n\n";

pub enum Next<T> {
    Item(T),
    /// Every sender is gone.
    Closed,
    /// Nothing was sent for the keep-alive interval: send `COMMENT`.
    KeepAlive,
}

/// How long the stream has been silent.
pub struct Quiet {
    every: Option<Duration>,
    since: Instant,
}

impl Quiet {
    /// `every`: the longest silence (None: never send comments).
    pub fn new(every: Option<std::time::Duration>) -> Self {
        Self { every, since: Instant::now() }
    }

    /// The next item, or `KeepAlive` once nothing has been sent for the
    /// interval (counted as sent: the next one comes an interval later).
    pub async fn next<T>(&mut self, rx: &mut UnboundedReceiver<T>) -> Next<T> {
        // recv is cancel-safe: a timeout loses no item.
        match self.within(rx.recv()).await {
            None => Next::KeepAlive,
            Some(item) => item.map_or(Next::Closed, Next::Item),
        }
    }

    /// What `work` gives, or None once nothing has been sent for the
    /// interval (then a keep-alive is due, and counted as sent). `work`
    /// must be cancel-safe: it is dropped when the interval runs out.
    pub async fn within<F: std::future::Future>(&mut self, work: F) -> Option<F::Output> {
        let Some(every) = self.every else { return Some(work.await) };
        match tokio::time::timeout_at(self.since + every, work).await {
            Ok(out) => Some(out),
            Err(_) => {
                self.sent();
                None
            }
        }
    }

    /// Something went out on the stream.
    pub fn sent(&mut self) {
        self.since = Instant::now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn silence_gives_comments_and_items_come_through() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<u32>();
        let mut q = Quiet::new(Some(std::time::Duration::from_millis(20)));
        assert!(matches!(q.next(&mut rx).await, Next::KeepAlive));
        tx.send(7).unwrap();
        assert!(matches!(q.next(&mut rx).await, Next::Item(7)));
        drop(tx);
        assert!(matches!(q.next(&mut rx).await, Next::Closed));
        let (_tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<u32>();
        let mut off = Quiet::new(None);
        let waited = tokio::time::timeout(std::time::Duration::from_millis(100), off.next(&mut rx)).await;
        assert!(waited.is_err(), "no comments when keep-alive is off");
    }
}
