//! A byte-capped LRU of cache-layout state keyed by token prefix.
//!
//! Entries hold each layer's exported 1-row state (`CacheState`) for a token
//! sequence, copied out of the layout's storage into buffers of their own
//! (`owned_state`), so an entry keeps alive exactly the bytes it counts and
//! the cap bounds real memory; importing an entry shares its arrays (MLX
//! arrays are immutable) rather than copying them. Entries live under a namespace
//! that names everything the state depends on (model, compute dtype, layout
//! signatures, tokenizer, adapter, drafter), so incompatible state is never
//! reused. `take` finds the longest usable common prefix of a prompt (at most
//! `len - 1` tokens: the last prompt token must run to produce logits),
//! imports it into fresh caches and trims them to the prefix (a layout that
//! cannot trim, like a wrapped ring or a recurrent state, is only reused at
//! its exact length: that is why prompt-boundary snapshots are stored, and
//! why an entry that cannot trim never supersedes the shorter ones). When a
//! candidate cannot be cut down, the caches are replaced by fresh ones and
//! the next-longest candidate is tried: a half-imported state never leaks.

use crate::owned_state;
use crate::ssd_cache::{SsdConfig, SsdCounters, SsdTier};
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
    /// 1-row) and returns how many tokens it covers (0 on a miss). `fresh`
    /// makes a new cache set, to start over after a candidate that could
    /// not be cut down to the shared prefix.
    pub fn take(
        &mut self,
        ns: &str,
        prompt: &[u32],
        caches: &mut [CacheBox],
        fresh: &dyn Fn() -> Option<Vec<CacheBox>>,
    ) -> usize {
        if !self.enabled() || prompt.len() < 2 {
            return 0;
        }
        let usable = &prompt[..prompt.len() - 1];
        // Longest shared prefix first; at equal length an entry that needs
        // no trim (exactly that long) first.
        let mut candidates: Vec<(usize, usize)> = self
            .entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.ns == ns)
            .map(|(i, e)| (i, common_prefix(&e.tokens, usable)))
            .filter(|&(_, k)| k > 0)
            .collect();
        candidates.sort_by_key(|&(i, k)| (std::cmp::Reverse(k), self.entries[i].tokens.len() - k));
        for (n, (i, k)) in candidates.into_iter().enumerate() {
            if n > 0 {
                match fresh() {
                    Some(f) => caches.iter_mut().zip(f).for_each(|(c, f)| *c = f),
                    None => break,
                }
            }
            let e = &self.entries[i];
            let excess = (e.tokens.len() - k) as u64;
            let fits = caches.iter_mut().zip(&e.states).all(|(c, s)| {
                // A layout that cannot cut the entry down to the shared prefix
                // (a wrapped ring, a recurrent state) makes it unusable here.
                c.import_state(share(s)).into_result().is_ok()
                    && (excess == 0 || (c.is_trimmable() && c.trim(excess) == excess))
            });
            if !fits {
                continue;
            }
            self.clock += 1;
            self.entries[i].used = self.clock;
            self.counters.hits += 1;
            self.counters.hit_tokens += k as u64;
            return k;
        }
        if let Some(f) = fresh() {
            caches.iter_mut().zip(f).for_each(|(c, f)| *c = f);
        }
        self.counters.misses += 1;
        0
    }

    /// Stores the state of `caches`, which hold exactly `tokens`; returns
    /// whether a new entry was stored and whether it can be trimmed.
    pub fn put(&mut self, ns: &str, tokens: &[u32], caches: &[CacheBox]) -> Option<bool> {
        if !self.enabled() || tokens.is_empty() {
            return None;
        }
        if self.entries.iter().any(|e| e.ns == ns && e.tokens == tokens) {
            return None;
        }
        let mut states = Vec::with_capacity(caches.len());
        for c in caches {
            match c.export_state().into_result() {
                Ok(s) => states.push(s),
                Err(_) => return None,
            }
        }
        let trimmable = caches.iter().all(|c| c.is_trimmable());
        self.insert(ns, tokens.to_vec(), states, trimmable).then_some(trimmable)
    }

    /// The longest prefix of `usable` any entry of `ns` shares.
    pub fn longest(&self, ns: &str, usable: &[u32]) -> usize {
        self.entries.iter().filter(|e| e.ns == ns).map(|e| common_prefix(&e.tokens, usable)).max().unwrap_or(0)
    }

    /// The stored states of exactly `tokens`, shared (for the SSD tier's writer).
    pub fn shares(&self, ns: &str, tokens: &[u32]) -> Option<Vec<CacheState>> {
        let e = self.entries.iter().find(|e| e.ns == ns && e.tokens == tokens)?;
        Some(e.states.iter().map(share).collect())
    }

    /// Stores already-exported 1-row states (copied into buffers of their
    /// own first); `trimmable` says whether every layout can cut them down
    /// (then shorter prefixes of it are redundant). True when stored.
    pub fn insert(&mut self, ns: &str, tokens: Vec<u32>, states: Vec<CacheState>, trimmable: bool) -> bool {
        if !self.enabled() || tokens.is_empty() || states.iter().any(|s| s.offset as usize != tokens.len()) {
            return false;
        }
        if owned_state::bytes(&states) > self.cap {
            return false;
        }
        let Ok(states) = owned_state::own(states) else { return false };
        let bytes = owned_state::bytes(&states);
        // A stored sequence that is a prefix of the new one is superseded,
        // unless the new one cannot be trimmed back to it.
        if trimmable {
            self.entries.retain(|e| !(e.ns == ns && e.tokens.len() < tokens.len() && tokens.starts_with(&e.tokens)));
        }
        self.clock += 1;
        self.entries.push(Entry { ns: ns.to_owned(), tokens, states, bytes, used: self.clock });
        self.shrink_to(self.cap);
        true
    }

    /// Bytes the entries hold.
    pub fn bytes(&self) -> usize {
        self.entries.iter().map(|e| e.bytes).sum()
    }

    /// Evicts least recently used entries until at most `limit` bytes are
    /// held (memory pressure gives the prefix cache's bytes back to requests).
    pub fn shrink_to(&mut self, limit: usize) {
        while self.bytes() > limit {
            let Some(oldest) = self.entries.iter().enumerate().min_by_key(|(_, e)| e.used).map(|(i, _)| i) else {
                break;
            };
            self.entries.remove(oldest);
            self.counters.evictions += 1;
        }
        self.counters.bytes = self.bytes() as u64;
        self.counters.entries = self.entries.len() as u64;
    }

    /// 1-row states copied out of `caches` (for callers that insert later).
    pub fn snapshot(caches: &[CacheBox]) -> Option<Vec<CacheState>> {
        caches.iter().map(|c| c.export_state().into_result().ok()).collect()
    }
}

/// The engine's prefix cache: the LRU above, behind a lock, under the
/// engine's namespace, with the SSD tier behind it when configured
/// (`ssd_cache`: written behind on every store, read back on a lookup it
/// can serve longer than RAM, promoted into RAM).
pub struct PrefixStore {
    cache: std::sync::Mutex<PrefixCache>,
    namespace: String,
    ssd: Option<SsdTier>,
}

impl PrefixStore {
    pub fn new(namespace: String, cap_bytes: usize) -> Self {
        Self { cache: std::sync::Mutex::new(PrefixCache::new(cap_bytes)), namespace, ssd: None }
    }

    /// With an SSD tier in `cfg.dir` (opened, scanned, its writer started).
    pub fn with_ssd(namespace: String, cap_bytes: usize, cfg: &SsdConfig) -> std::io::Result<Self> {
        let ssd = SsdTier::open(cfg, &namespace)?;
        Ok(Self { ssd: Some(ssd), ..Self::new(namespace, cap_bytes) })
    }

    /// The SSD tier's live counters, when there is one.
    pub fn ssd_counters(&self) -> Option<std::sync::Arc<SsdCounters>> {
        self.ssd.as_ref().map(SsdTier::counters)
    }

    /// Hands a just-stored entry to the SSD tier's writer.
    fn write_behind(&self, p: &PrefixCache, tokens: &[u32], trimmable: Option<bool>) {
        if let (Some(ssd), Some(trimmable)) = (&self.ssd, trimmable) {
            if let Some(states) = p.shares(&self.namespace, tokens) {
                ssd.write_behind(tokens, states, trimmable);
            }
        }
    }

    fn lock(&self) -> Option<std::sync::MutexGuard<'_, PrefixCache>> {
        self.cache.lock().ok()
    }

    pub fn enabled(&self) -> bool {
        self.lock().is_some_and(|p| p.enabled())
    }

    /// Everything reused state depends on (model, dtype, layouts, tokenizer,
    /// adapters, drafter).
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Imports the longest cached prefix of `prompt` into fresh `caches`;
    /// `fresh` makes a new cache set.
    /// A prefix the SSD tier holds longer than any in RAM is read back and
    /// promoted into RAM first (not written back).
    pub fn take(&self, prompt: &[u32], caches: &mut [CacheBox], fresh: &dyn Fn() -> Option<Vec<CacheBox>>) -> usize {
        let Some(mut p) = self.lock() else { return 0 };
        if let Some(ssd) = &self.ssd {
            if p.enabled() && prompt.len() >= 2 {
                let usable = &prompt[..prompt.len() - 1];
                if let Some(e) = ssd.fetch(usable, p.longest(&self.namespace, usable), p.cap as u64) {
                    p.insert(&self.namespace, e.tokens, e.states, e.trimmable);
                }
            }
        }
        p.take(&self.namespace, prompt, caches, fresh)
    }

    /// Stores `caches`, which must hold exactly `tokens`.
    pub fn put(&self, tokens: &[u32], caches: &[CacheBox]) {
        if let Some(mut p) = self.lock() {
            let stored = p.put(&self.namespace, tokens, caches);
            self.write_behind(&p, tokens, stored);
        }
    }

    /// Stores exported 1-row states for `tokens`; `trimmable` as the
    /// layouts they came from report it.
    pub fn insert(&self, tokens: Vec<u32>, states: Vec<CacheState>, trimmable: bool) {
        if let Some(mut p) = self.lock() {
            let key = self.ssd.as_ref().map(|_| tokens.clone());
            let stored = p.insert(&self.namespace, tokens, states, trimmable);
            if let Some(key) = key {
                self.write_behind(&p, &key, stored.then_some(trimmable));
            }
        }
    }

    /// Stores the end state of a generation: `known` = prompt + emitted
    /// tokens; the caches may hold one token more (a step computed ahead),
    /// which is trimmed first when the layouts can trim.
    pub fn put_final(&self, known: &[u32], caches: &mut [CacheBox]) {
        if !self.enabled() {
            return;
        }
        let Some(held) = caches.first().map(|c| c.offset() as usize) else { return };
        if held > known.len() {
            let extra = (held - known.len()) as u64;
            if !caches.iter_mut().all(|c| c.is_trimmable() && c.trim(extra) == extra) {
                return;
            }
        }
        let held = caches.first().map(|c| c.offset() as usize).unwrap_or(0);
        self.put(&known[..held.min(known.len())], caches);
    }

    /// Evicts entries until at most `limit` bytes are held; true when
    /// something was evicted.
    pub fn shrink(&self, limit: u64) -> bool {
        let Some(mut p) = self.lock() else { return false };
        let before = p.counters.evictions;
        p.shrink_to(limit.min(usize::MAX as u64) as usize);
        p.counters.evictions > before
    }

    pub fn counters(&self) -> CacheCounters {
        self.lock().map(|p| p.counters).unwrap_or_default()
    }
}
