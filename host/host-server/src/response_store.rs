//! Responses kept for `previous_response_id` and `GET`/`DELETE
//! /v1/responses/{id}`: in memory, each for a time to live, all together
//! under a byte cap (the oldest leave first). A restart forgets them.
//!
//! Each entry holds its whole conversation rather than a link to the
//! previous response, so a follow-up never depends on an ancestor that
//! has expired or been evicted; the cap bounds what that copying costs.

use serde_json::Value;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What a stored response lets a client do later.
pub struct StoredResponse {
    /// The response object, as `GET` returns it.
    pub body: Value,
    /// The conversation so far as chat messages (the response's own
    /// output last), which a follow-up's input continues.
    pub conversation: Vec<Value>,
}

impl StoredResponse {
    fn bytes(&self, id: &str) -> usize {
        let size = |v: &Value| serde_json::to_vec(v).map_or(0, |b| b.len());
        id.len() + size(&self.body) + self.conversation.iter().map(size).sum::<usize>()
    }
}

struct Entry {
    stored: Arc<StoredResponse>,
    at: Instant,
    bytes: usize,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<String, Entry>,
    /// Ids in the order they were stored (every entry lives as long, so
    /// the oldest also expire first).
    order: VecDeque<String>,
    bytes: usize,
}

pub struct ResponseStore {
    ttl: Duration,
    cap: usize,
    inner: Mutex<Inner>,
}

impl ResponseStore {
    pub fn new(ttl: Duration, cap_bytes: usize) -> Self {
        Self { ttl, cap: cap_bytes, inner: Mutex::new(Inner::default()) }
    }

    /// Keeps `stored` under `id`, evicting the oldest entries to make room.
    /// Returns false (and keeps nothing) when it alone exceeds the cap.
    pub fn put(&self, id: &str, stored: StoredResponse) -> bool {
        self.put_at(id, stored, Instant::now())
    }

    pub fn get(&self, id: &str) -> Option<Arc<StoredResponse>> {
        self.get_at(id, Instant::now())
    }

    /// Forgets `id`; false when it was not there (or had expired).
    pub fn remove(&self, id: &str) -> bool {
        let mut inner = self.lock();
        self.expire(&mut inner, Instant::now());
        let removed = inner.entries.remove(id);
        if let Some(e) = &removed {
            inner.bytes -= e.bytes;
            inner.order.retain(|k| k != id);
        }
        removed.is_some()
    }

    /// Entries and their bytes, for tests and /stats.
    pub fn usage(&self) -> (usize, usize) {
        let inner = self.lock();
        (inner.entries.len(), inner.bytes)
    }

    fn put_at(&self, id: &str, stored: StoredResponse, now: Instant) -> bool {
        let bytes = stored.bytes(id);
        if bytes > self.cap {
            return false;
        }
        let mut inner = self.lock();
        self.expire(&mut inner, now);
        if let Some(old) = inner.entries.remove(id) {
            inner.bytes -= old.bytes;
            inner.order.retain(|k| k != id);
        }
        while inner.bytes + bytes > self.cap {
            let Some(oldest) = inner.order.pop_front() else { break };
            if let Some(e) = inner.entries.remove(&oldest) {
                inner.bytes -= e.bytes;
            }
        }
        inner.entries.insert(id.to_owned(), Entry { stored: Arc::new(stored), at: now, bytes });
        inner.order.push_back(id.to_owned());
        inner.bytes += bytes;
        true
    }

    fn get_at(&self, id: &str, now: Instant) -> Option<Arc<StoredResponse>> {
        let mut inner = self.lock();
        self.expire(&mut inner, now);
        inner.entries.get(id).map(|e| e.stored.clone())
    }

    fn expire(&self, inner: &mut Inner, now: Instant) {
        while let Some(oldest) = inner.order.front() {
            let expired = inner.entries.get(oldest).is_none_or(|e| now.duration_since(e.at) >= self.ttl);
            if !expired {
                break;
            }
            if let Some(e) = inner.entries.remove(oldest) {
                inner.bytes -= e.bytes;
            }
            inner.order.pop_front();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic elsewhere while holding the lock leaves the map whole.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn stored(text: &str) -> StoredResponse {
        StoredResponse { body: json!({ "t": text }), conversation: vec![json!({ "role": "user", "content": text })] }
    }

    #[test]
    fn entries_expire_after_their_time_to_live() {
        let s = ResponseStore::new(Duration::from_secs(10), 1 << 20);
        let t0 = Instant::now();
        assert!(s.put_at("a", stored("x"), t0));
        assert!(s.put_at("b", stored("y"), t0 + Duration::from_secs(5)));
        assert!(s.get_at("a", t0 + Duration::from_secs(9)).is_some());
        assert!(s.get_at("a", t0 + Duration::from_secs(10)).is_none(), "expired");
        assert!(s.get_at("b", t0 + Duration::from_secs(10)).is_some());
        assert_eq!(s.usage().0, 1);
        assert!(s.get_at("b", t0 + Duration::from_secs(15)).is_none());
        assert_eq!(s.usage(), (0, 0));
    }

    #[test]
    fn the_oldest_leave_to_keep_under_the_cap() {
        let one = stored("0123456789").bytes("r0");
        let s = ResponseStore::new(Duration::from_secs(60), 3 * one);
        for i in 0..5 {
            assert!(s.put(&format!("r{i}"), stored("0123456789")));
        }
        let kept: Vec<bool> = (0..5).map(|i| s.get(&format!("r{i}")).is_some()).collect();
        assert_eq!(kept, [false, false, true, true, true]);
        assert_eq!(s.usage(), (3, 3 * one));
        assert!(!s.put("huge", stored(&"x".repeat(4 * one))), "larger than the cap alone");
        assert!(s.get("huge").is_none());
    }

    #[test]
    fn removed_entries_are_gone_and_their_bytes_freed() {
        let s = ResponseStore::new(Duration::from_secs(60), 1 << 20);
        assert!(s.put("a", stored("x")));
        assert!(s.remove("a"));
        assert!(!s.remove("a"));
        assert!(s.get("a").is_none());
        assert_eq!(s.usage(), (0, 0));
        // Storing an id again replaces it.
        assert!(s.put("b", stored("x")));
        assert!(s.put("b", stored("yy")));
        assert_eq!(s.get("b").unwrap().body, json!({ "t": "yy" }));
        assert_eq!(s.usage().0, 1);
    }
}
