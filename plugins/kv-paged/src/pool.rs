//! The block pool: every sealed block of K/V any cache of this plugin holds,
//! each ONE immutable pair of MLX arrays shared by reference.
//!
//! A block is `Arc<Block>`: rows that share a prefix hold the same `Arc`s,
//! so the prefix's K/V exist once. Blocks are never written after they are
//! sealed (copy-on-write: a row that writes past a shared point starts a
//! tail of its own), which is also what lets MLX hand their buffers to the
//! prefix cache without a copy.
//!
//! Sharing must survive a trip through the boundary: a state exported to
//! the prefix cache (or merged into a batch) carries its tensors AND each
//! block's key in `meta`; an import finds a live block by its key and takes
//! a reference instead of a new copy. Keys are `(nonce, serial)`: the nonce
//! is random per process, so a state read back from disk after a restart
//! (another process's keys) never aliases a block of this one; such blocks
//! are registered under their old keys, and imports of the same file share
//! them too.

use model_kit::Array;
use plugin_api::PoolUsage;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

/// A block's identity across exports and imports.
pub type Key = (u64, u64);

pub struct Block {
    pub key: Key,
    /// `[1, H, block, D_k]` and `[1, H, block, D_v]`, evaluated or lazy,
    /// never written again.
    pub keys: Array,
    pub values: Array,
    bytes: u64,
}

// SAFETY: a block's arrays are never mutated after it is made; MLX array
// handles are reference counted atomically, so cloning one from another
// thread (the prefix cache's SSD writer holds tensors of the same arrays)
// is safe. The host drives every cache from one thread.
unsafe impl Sync for Block {}

impl Drop for Block {
    fn drop(&mut self) {
        let mut reg = registry().lock().unwrap_or_else(|e| e.into_inner());
        if reg.get(&self.key).is_some_and(|w| w.strong_count() == 0) {
            reg.remove(&self.key);
        }
        LIVE.fetch_sub(1, Ordering::Relaxed);
        LIVE_BYTES.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

static LIVE: AtomicU64 = AtomicU64::new(0);
static LIVE_BYTES: AtomicU64 = AtomicU64::new(0);
static SERIAL: AtomicU64 = AtomicU64::new(1);
/// Tokens held in rows' private tails, across every cache.
pub static TAIL_TOKENS: AtomicU64 = AtomicU64::new(0);
/// The block size of the scheme in use (reported with the counts).
pub static BLOCK_TOKENS: AtomicU64 = AtomicU64::new(0);

fn registry() -> &'static Mutex<HashMap<Key, Weak<Block>>> {
    static R: OnceLock<Mutex<HashMap<Key, Weak<Block>>>> = OnceLock::new();
    R.get_or_init(|| Mutex::new(HashMap::new()))
}

/// This process's key prefix: random (std's per-process hash keys), so keys
/// written to disk by another process never match a block of this one.
pub fn nonce() -> u64 {
    static N: OnceLock<u64> = OnceLock::new();
    *N.get_or_init(|| {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
        h.finish()
    })
}

fn insert(key: Key, keys: Array, values: Array) -> Arc<Block> {
    let bytes = (keys.nbytes() + values.nbytes()) as u64;
    let b = Arc::new(Block { key, keys, values, bytes });
    LIVE.fetch_add(1, Ordering::Relaxed);
    LIVE_BYTES.fetch_add(bytes, Ordering::Relaxed);
    registry().lock().unwrap_or_else(|e| e.into_inner()).insert(key, Arc::downgrade(&b));
    b
}

/// A new block of freshly written K/V.
pub fn seal(keys: Array, values: Array) -> Arc<Block> {
    insert((nonce(), SERIAL.fetch_add(1, Ordering::Relaxed)), keys, values)
}

/// The live block under `key`, or a new one made of `keys`/`values` (the
/// same content: a key names one block's K/V for good).
pub fn adopt(key: Key, keys: Array, values: Array) -> Arc<Block> {
    let found = registry().lock().unwrap_or_else(|e| e.into_inner()).get(&key).and_then(Weak::upgrade);
    found.unwrap_or_else(|| insert(key, keys, values))
}

/// What the pool holds now.
pub fn usage() -> PoolUsage {
    let reg = registry().lock().unwrap_or_else(|e| e.into_inner());
    let references = reg.values().map(|w| w.strong_count() as u64).sum();
    PoolUsage {
        block_tokens: BLOCK_TOKENS.load(Ordering::Relaxed) as u32,
        blocks: LIVE.load(Ordering::Relaxed),
        references,
        bytes: LIVE_BYTES.load(Ordering::Relaxed),
        tail_tokens: TAIL_TOKENS.load(Ordering::Relaxed),
    }
}
