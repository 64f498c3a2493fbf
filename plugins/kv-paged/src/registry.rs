//! Block keys and where a key's block lives.
//!
//! A sealed block has a key `(nonce, serial)` that names its K/V for good;
//! an exported state carries its blocks' keys in `meta`, so an import can
//! find a block that is still alive and take a reference instead of a copy.
//! The nonce is random per process, so a state read back from disk after a
//! restart (another process's keys) never aliases a block of this one.
//!
//! This map goes from a key to the pool holding it, so that a cache with
//! nothing stored yet can join the pool its first import's blocks live in
//! (each layer's caches then share one pool: the 1-row cache of a prefix-
//! cache hit, the batch it merges into, the cohort that became the batch).

use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

/// A block's identity across exports and imports.
pub type Key = (u64, u64);

static SERIAL: AtomicU64 = AtomicU64::new(1);

/// A key for a newly sealed block.
pub fn fresh() -> Key {
    (nonce(), SERIAL.fetch_add(1, Ordering::Relaxed))
}

/// This process's key prefix: random (std's per-process hash keys), so keys
/// written to disk by another process never match a block of this one.
fn nonce() -> u64 {
    static N: OnceLock<u64> = OnceLock::new();
    *N.get_or_init(|| {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
        h.finish()
    })
}

/// A pool, as this map holds it: weakly (a pool no cache holds is gone),
/// and by any type, so that this map needs nothing of the pool's.
pub type Holder = Weak<dyn Any + Send + Sync>;

type Map = HashMap<Key, (u64, Holder)>;

fn map() -> &'static Mutex<Map> {
    static M: OnceLock<Mutex<Map>> = OnceLock::new();
    M.get_or_init(|| Mutex::new(HashMap::new()))
}

fn lock() -> std::sync::MutexGuard<'static, Map> {
    map().lock().unwrap_or_else(|e| e.into_inner())
}

/// Records that pool `id` holds `key` (the latest holder wins).
pub fn publish(key: Key, id: u64, pool: Holder) {
    lock().insert(key, (id, pool));
}

/// Forgets `key` if pool `id` is the one recorded for it.
pub fn withdraw(key: Key, id: u64) {
    let mut m = lock();
    if m.get(&key).is_some_and(|(holder, _)| *holder == id) {
        m.remove(&key);
    }
}

/// The live pool recorded for `key`. (Never called with a pool locked:
/// pools lock this map while they are locked.)
pub fn find<P: Send + Sync + 'static>(key: Key) -> Option<Arc<P>> {
    lock().get(&key).and_then(|(_, p)| p.upgrade()).and_then(|p| p.downcast::<P>().ok())
}
