//! A block pool: one layer's K/V storage (`storage`) and the bookkeeping of
//! its blocks: reference counts, the free list, and the keys of sealed
//! blocks.
//!
//! A block is an index into the storage. Rows that share a prefix hold the
//! same index (one reference each), so the prefix's K/V exist once. A
//! block is sealed (given a key) when it is full and never written again
//! while it has one; a row's partly filled last block is its own (one
//! reference, no key) and is written in place. Freed blocks go to a free
//! list and are reused; the storage grows geometrically when none is free,
//! and is dropped when no block is in use.
//!
//! The counters behind `pool_usage` are process-wide (every pool of every
//! layer): sealed blocks, references to them, their bytes, and the tokens
//! in rows' private last blocks.

use crate::registry::{self, Key};
use crate::storage::Storage;
use model_kit::ops::dtype_size;
use model_kit::{error, Dtype, Result};
use plugin_api::PoolUsage;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

/// A pool as the caches of one layer share it.
pub type Shared = Arc<Mutex<Pool>>;

/// What blocks of a pool hold: tokens per block and K/V shapes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Geometry {
    pub block: usize,
    pub heads: i32,
    pub k_dim: i32,
    pub v_dim: i32,
}

static SEALED: AtomicU64 = AtomicU64::new(0);
static REFERENCES: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);
/// Tokens in rows' private last blocks, across every cache.
pub static TAIL_TOKENS: AtomicU64 = AtomicU64::new(0);
/// The block size of the scheme in use (reported with the counts).
pub static BLOCK_TOKENS: AtomicU64 = AtomicU64::new(0);
static IDS: AtomicU64 = AtomicU64::new(1);

/// What the pools hold now.
pub fn usage() -> PoolUsage {
    PoolUsage {
        block_tokens: BLOCK_TOKENS.load(Ordering::Relaxed) as u32,
        blocks: SEALED.load(Ordering::Relaxed),
        references: REFERENCES.load(Ordering::Relaxed),
        bytes: BYTES.load(Ordering::Relaxed),
        tail_tokens: TAIL_TOKENS.load(Ordering::Relaxed),
    }
}

pub struct Pool {
    id: u64,
    me: Weak<Mutex<Pool>>,
    pub geometry: Geometry,
    storage: Option<Storage>,
    refs: Vec<u32>,
    keys: Vec<Option<Key>>,
    by_key: HashMap<Key, u32>,
    free: Vec<u32>,
    live: usize,
    block_bytes: u64,
}

pub fn new(geometry: Geometry) -> Shared {
    Arc::new_cyclic(|me| {
        Mutex::new(Pool {
            id: IDS.fetch_add(1, Ordering::Relaxed),
            me: me.clone(),
            geometry,
            storage: None,
            refs: Vec::new(),
            keys: Vec::new(),
            by_key: HashMap::new(),
            free: Vec::new(),
            live: 0,
            block_bytes: 0,
        })
    })
}

pub fn lock(p: &Shared) -> MutexGuard<'_, Pool> {
    p.lock().unwrap_or_else(|e| e.into_inner())
}

impl Pool {
    pub fn storage(&self) -> Result<&Storage> {
        self.storage.as_ref().ok_or_else(|| error("kv-paged: the pool holds no blocks"))
    }

    pub fn storage_mut(&mut self) -> Result<&mut Storage> {
        self.storage.as_mut().ok_or_else(|| error("kv-paged: the pool holds no blocks"))
    }

    /// At least `n` free blocks: grows the storage once, to at least twice
    /// its size, so growing costs O(1) copies per block over time.
    pub fn reserve(&mut self, n: usize, dtype: Dtype) -> Result<()> {
        if self.free.len() >= n && self.storage.is_some() {
            return Ok(());
        }
        let g = self.geometry;
        let cap = self.storage.as_ref().map_or(0, Storage::capacity);
        let least = (256 / g.block).max(4);
        let new_cap = (cap + n - self.free.len().min(n)).max(cap * 2).max(least);
        match &mut self.storage {
            Some(s) => s.grow(new_cap)?,
            None => {
                self.storage = Some(Storage::new(new_cap, g.block, g.heads, (g.k_dim, g.v_dim), dtype)?);
                self.block_bytes =
                    (g.block * g.heads as usize * (g.k_dim + g.v_dim) as usize * dtype_size(dtype)) as u64;
            }
        }
        self.refs.resize(new_cap, 0);
        self.keys.resize(new_cap, None);
        // Popped in ascending order: a row's new blocks are then
        // consecutive slots, written with one `slice_update`.
        self.free.extend((cap as u32..new_cap as u32).rev());
        Ok(())
    }

    /// A free block, held once (private, unsealed).
    pub fn alloc(&mut self, dtype: Dtype) -> Result<u32> {
        self.reserve(1, dtype)?;
        let i = self.free.pop().ok_or_else(|| error("kv-paged: no free block after growing"))?;
        self.refs[i as usize] = 1;
        self.live += 1;
        Ok(i)
    }

    pub fn refs(&self, i: u32) -> u32 {
        self.refs[i as usize]
    }

    pub fn key(&self, i: u32) -> Option<Key> {
        self.keys[i as usize]
    }

    pub fn retain(&mut self, i: u32) {
        self.refs[i as usize] += 1;
        if self.keys[i as usize].is_some() {
            REFERENCES.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Drops one reference; the last one frees the block (and, when no
    /// block is left in use, the storage).
    pub fn release(&mut self, i: u32) {
        let iu = i as usize;
        self.refs[iu] -= 1;
        if self.keys[iu].is_some() {
            REFERENCES.fetch_sub(1, Ordering::Relaxed);
        }
        if self.refs[iu] > 0 {
            return;
        }
        self.unseal(i);
        self.free.push(i);
        self.live -= 1;
        if self.live == 0 {
            self.storage = None;
            self.refs.clear();
            self.keys.clear();
            self.free.clear();
        }
    }

    /// Seals a full block under a new key.
    pub fn seal(&mut self, i: u32) {
        self.register(i, registry::fresh());
    }

    /// Seals a full block under `key` (a copy of the block the key names).
    pub fn register(&mut self, i: u32, key: Key) {
        self.keys[i as usize] = Some(key);
        self.by_key.insert(key, i);
        registry::publish(key, self.id, self.me.clone() as registry::Holder);
        SEALED.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(self.block_bytes, Ordering::Relaxed);
        REFERENCES.fetch_add(self.refs[i as usize] as u64, Ordering::Relaxed);
    }

    /// Takes a block's key away, so it can be written again (its only
    /// holder trims into it) or reused.
    pub fn unseal(&mut self, i: u32) {
        let Some(key) = self.keys[i as usize].take() else { return };
        self.by_key.remove(&key);
        registry::withdraw(key, self.id);
        SEALED.fetch_sub(1, Ordering::Relaxed);
        BYTES.fetch_sub(self.block_bytes, Ordering::Relaxed);
        REFERENCES.fetch_sub(self.refs[i as usize] as u64, Ordering::Relaxed);
    }

    /// The block sealed under `key`, with one more reference, if held here.
    pub fn adopt(&mut self, key: Key) -> Option<u32> {
        let i = *self.by_key.get(&key)?;
        self.retain(i);
        Some(i)
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        for i in 0..self.keys.len() as u32 {
            self.unseal(i);
        }
    }
}
