//! A byte-capped LRU of cache-layout state keyed by token prefix.
//!
//! Entries hold each layer's exported 1-row state (`CacheState`: immutable
//! MLX arrays, shared, not copied) for a token sequence, under a namespace
//! that names everything the state depends on (model, compute dtype, layout
//! signatures, tokenizer, adapter, drafter), so incompatible state is never
//! reused. `take` finds the longest usable common prefix of a prompt (at most
//! `len - 1` tokens: the last prompt token must run to produce logits),
//! imports it into fresh caches and trims them to the prefix (a layout that
//! cannot trim, like a wrapped ring, is only reused at its exact length:
//! that is why prompt-boundary snapshots are stored).

use plugin_api::abi_stable::std_types::RVec;
use plugin_api::{CacheBox, CacheState, Tensor};

struct Entry {
    ns: String,
    tokens: Vec<u32>,
    states: Vec<CacheState>,
    bytes: usize,
    used: u64,
}

#[derive(Default, Clone, Copy, Debug)]
pub struct CacheCounters {
    pub hits: u64,
    pub misses: u64,
    pub hit_tokens: u64,
    pub bytes: u64,
    pub entries: u64,
    pub evictions: u64,
}

pub struct PrefixCache {
    entries: Vec<Entry>,
    cap: usize,
    clock: u64,
    pub counters: CacheCounters,
}

fn tensor_bytes(t: &Tensor) -> usize {
    unsafe { mlx_sys::mlx_array_nbytes(t.as_raw()) }
}

/// A new owned copy of a state (its arrays are shared, refcounted).
fn share(s: &CacheState) -> CacheState {
    CacheState {
        signature: s.signature.clone(),
        offset: s.offset,
        tensors: s.tensors.iter().map(|t| t.borrow().to_owned()).collect::<RVec<Tensor>>(),
        meta: s.meta.clone(),
    }
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl PrefixCache {
    pub fn new(cap_bytes: usize) -> Self {
        Self { entries: Vec::new(), cap: cap_bytes, clock: 0, counters: CacheCounters::default() }
    }

    pub fn enabled(&self) -> bool {
        self.cap > 0
    }

    /// Imports the longest usable prefix of `prompt` into `caches` (fresh,
    /// 1-row) and returns how many tokens it covers (0 on a miss).
    pub fn take(&mut self, ns: &str, prompt: &[u32], caches: &mut [CacheBox]) -> usize {
        if !self.enabled() || prompt.len() < 2 {
            return 0;
        }
        let usable = &prompt[..prompt.len() - 1];
        let mut best: Option<(usize, usize)> = None; // (entry index, prefix length)
        for (i, e) in self.entries.iter().enumerate() {
            if e.ns != ns {
                continue;
            }
            let k = common_prefix(&e.tokens, usable);
            if k == 0 || best.is_some_and(|(_, b)| b >= k) {
                continue;
            }
            best = Some((i, k));
        }
        let Some((i, k)) = best else {
            self.counters.misses += 1;
            return 0;
        };
        let e = &mut self.entries[i];
        let excess = (e.tokens.len() - k) as u64;
        for (c, s) in caches.iter_mut().zip(&e.states) {
            if c.import_state(share(s)).into_result().is_err() {
                self.counters.misses += 1;
                return 0;
            }
            if excess > 0 && (!c.is_trimmable() || c.trim(excess) != excess) {
                // This layout cannot cut the entry down to the shared prefix.
                self.counters.misses += 1;
                return 0;
            }
        }
        self.clock += 1;
        e.used = self.clock;
        self.counters.hits += 1;
        self.counters.hit_tokens += k as u64;
        k
    }

    /// Stores the state of `caches`, which hold exactly `tokens`.
    pub fn put(&mut self, ns: &str, tokens: &[u32], caches: &[CacheBox]) {
        if !self.enabled() || tokens.is_empty() {
            return;
        }
        if self.entries.iter().any(|e| e.ns == ns && e.tokens == tokens) {
            return;
        }
        let mut states = Vec::with_capacity(caches.len());
        for c in caches {
            match c.export_state().into_result() {
                Ok(s) => states.push(s),
                Err(_) => return,
            }
        }
        self.insert(ns, tokens.to_vec(), states);
    }

    /// Stores already-exported 1-row states.
    pub fn insert(&mut self, ns: &str, tokens: Vec<u32>, states: Vec<CacheState>) {
        if !self.enabled() || tokens.is_empty() || states.iter().any(|s| s.offset as usize != tokens.len()) {
            return;
        }
        let bytes: usize = states.iter().flat_map(|s| s.tensors.iter()).map(tensor_bytes).sum();
        if bytes > self.cap {
            return;
        }
        // A stored sequence that is a prefix of the new one is superseded.
        self.entries.retain(|e| !(e.ns == ns && e.tokens.len() < tokens.len() && tokens.starts_with(&e.tokens)));
        self.clock += 1;
        self.entries.push(Entry { ns: ns.to_owned(), tokens, states, bytes, used: self.clock });
        while self.entries.iter().map(|e| e.bytes).sum::<usize>() > self.cap {
            let oldest = self.entries.iter().enumerate().min_by_key(|(_, e)| e.used).map(|(i, _)| i).unwrap();
            self.entries.remove(oldest);
            self.counters.evictions += 1;
        }
        self.counters.bytes = self.entries.iter().map(|e| e.bytes).sum::<usize>() as u64;
        self.counters.entries = self.entries.len() as u64;
    }

    /// 1-row states copied out of `caches` (for callers that insert later).
    pub fn snapshot(caches: &[CacheBox]) -> Option<Vec<CacheState>> {
        caches.iter().map(|c| c.export_state().into_result().ok()).collect()
    }
}
