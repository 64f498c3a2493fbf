//! The SSD tier of the prefix cache (`--ssd-cache DIR`).
//!
//! Write-behind: every entry the RAM tier stores is handed (its tensors
//! shared, not copied: they are evaluated and immutable) to a writer
//! thread, which writes it as one file (`format`) atomically, so an entry
//! survives a crash of the server as soon as its write has finished, and a
//! RAM eviction needs no write. On a lookup the tier is asked only when it
//! holds a longer usable prefix than the RAM tier; the file is read on the
//! engine thread, checked, turned into `CacheState`s and promoted into the
//! RAM tier, which then serves the request as on a RAM hit. The directory
//! is bounded by `--ssd-cache-max` (LRU by last use, files deleted). Files
//! are only ever created inside DIR under names that are hashes.

pub mod format;
mod index;
pub mod io;

use index::{DiskEntry, Index};
use plugin_api::CacheState;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{mpsc, Arc, Mutex};

/// What `--ssd-cache`, `--ssd-cache-max` and `--ssd-cache-verify` ask for.
#[derive(Debug, Clone)]
pub struct SsdConfig {
    pub dir: PathBuf,
    pub max_bytes: u64,
    /// Check each file's content hash on load (header and sizes always are).
    pub verify: bool,
}

/// Writes queued and not yet done beyond which a new entry is not written
/// (counted in `write_skips`): the writer keeps each queued entry's arrays alive.
const MAX_PENDING: u64 = 8;

/// Live counters (`/stats`, `/metrics`).
#[derive(Default, Debug)]
pub struct SsdCounters {
    /// Lookups served from a file (promoted into RAM).
    pub hits: AtomicU64,
    /// Lookups that found nothing longer on disk than in RAM.
    pub misses: AtomicU64,
    /// Files skipped: corrupt, truncated, foreign or of another namespace.
    pub rejected: AtomicU64,
    /// Entries written, and writes that failed or were skipped.
    pub writes: AtomicU64,
    pub write_errors: AtomicU64,
    pub write_skips: AtomicU64,
    /// Writes queued and not yet done.
    pub pending: AtomicU64,
    /// Files deleted to stay within the cap (least recently used first).
    pub evictions: AtomicU64,
    /// Bytes and entries on disk for this namespace.
    pub bytes: AtomicU64,
    pub entries: AtomicU64,
}

impl SsdCounters {
    /// (name, Prometheus kind, help, value) of every counter, for
    /// `/stats` (`ssd_cache_<name>`) and `/metrics` (`ssd_cache_<name>[_total]`).
    pub fn fields(&self) -> [(&'static str, &'static str, &'static str, u64); 10] {
        let v = |a: &AtomicU64| a.load(Relaxed);
        [
            ("hits", "counter", "Prompt lookups served from an SSD cache file.", v(&self.hits)),
            ("misses", "counter", "Prompt lookups the SSD tier had nothing longer for.", v(&self.misses)),
            (
                "rejected",
                "counter",
                "SSD cache files skipped: corrupt, truncated, foreign or of another namespace.",
                v(&self.rejected),
            ),
            ("writes", "counter", "Entries written to the SSD cache.", v(&self.writes)),
            ("write_errors", "counter", "SSD cache writes that failed.", v(&self.write_errors)),
            (
                "write_skips",
                "counter",
                "Entries not written (writer behind, or larger than the cap).",
                v(&self.write_skips),
            ),
            ("evictions", "counter", "SSD cache files deleted to stay within --ssd-cache-max.", v(&self.evictions)),
            ("pending", "gauge", "SSD cache writes queued and not yet done.", v(&self.pending)),
            ("bytes", "gauge", "Bytes of this model's SSD cache files.", v(&self.bytes)),
            ("entries", "gauge", "This model's SSD cache files.", v(&self.entries)),
        ]
    }
}

impl SsdCounters {
    /// Every counter, in field order: what [`SsdCounters::load`] takes back.
    pub fn snapshot(&self) -> Vec<u64> {
        self.cells().iter().map(|c| c.load(Relaxed)).collect()
    }

    /// Overwrites every counter with a snapshot's (another process's tier).
    pub fn load(&self, v: &[u64]) {
        for (cell, &x) in self.cells().iter().zip(v) {
            cell.store(x, Relaxed);
        }
    }

    fn cells(&self) -> [&AtomicU64; 10] {
        [
            &self.hits,
            &self.misses,
            &self.rejected,
            &self.writes,
            &self.write_errors,
            &self.write_skips,
            &self.pending,
            &self.evictions,
            &self.bytes,
            &self.entries,
        ]
    }
}

struct Shared {
    dir: PathBuf,
    ns: String,
    index: Mutex<Index>,
    counters: Arc<SsdCounters>,
}

impl Shared {
    fn sync_sizes(&self, index: &Index) {
        self.counters.bytes.store(index.bytes(), Relaxed);
        self.counters.entries.store(index.count() as u64, Relaxed);
    }
}

struct WriteJob {
    name: String,
    tokens: Vec<u32>,
    trimmable: bool,
    states: Vec<CacheState>,
}

impl WriteJob {
    /// Whether writing `self` would delete `older`'s file at once.
    fn supersedes(&self, older: &WriteJob) -> bool {
        self.trimmable && self.tokens.len() > older.tokens.len() && self.tokens.starts_with(&older.tokens)
    }
}

pub struct SsdTier {
    shared: Arc<Shared>,
    verify: bool,
    tx: Option<mpsc::Sender<WriteJob>>,
    writer: Option<std::thread::JoinHandle<()>>,
}

/// An entry read back from disk, for the RAM tier.
pub struct Promoted {
    pub tokens: Vec<u32>,
    pub states: Vec<CacheState>,
    pub trimmable: bool,
}

impl SsdTier {
    /// Opens (creating) the directory, removes leftover temp files, indexes
    /// the entries of `ns` and starts the writer thread.
    pub fn open(cfg: &SsdConfig, ns: &str) -> std::io::Result<Self> {
        let (index, report) = Index::scan(&cfg.dir, ns, cfg.max_bytes)?;
        let counters = Arc::new(SsdCounters::default());
        counters.rejected.store(report.rejected, Relaxed);
        let shared = Arc::new(Shared { dir: cfg.dir.clone(), ns: ns.to_owned(), index: Mutex::new(index), counters });
        if let Ok(i) = shared.index.lock() {
            shared.sync_sizes(&i);
        }
        let (tx, rx) = mpsc::channel::<WriteJob>();
        let s = shared.clone();
        let writer = std::thread::Builder::new().name("ssd-cache-writer".into()).spawn(move || {
            while let Ok(first) = rx.recv() {
                let mut queued: std::collections::VecDeque<WriteJob> =
                    std::iter::once(first).chain(rx.try_iter()).collect();
                while let Some(job) = queued.pop_front() {
                    // A prompt-boundary snapshot whose generation already
                    // ended is not written: the end state supersedes it.
                    if !queued.iter().any(|later| later.supersedes(&job)) {
                        s.write(job);
                    }
                    s.counters.pending.fetch_sub(1, Relaxed);
                }
            }
        })?;
        Ok(Self { shared, verify: cfg.verify, tx: Some(tx), writer: Some(writer) })
    }

    pub fn counters(&self) -> Arc<SsdCounters> {
        self.shared.counters.clone()
    }

    /// Queues an entry the RAM tier has just stored (its states shared)
    /// unless the directory already has it or the writer is behind.
    pub fn write_behind(&self, tokens: &[u32], states: Vec<CacheState>, trimmable: bool) {
        let name = format::entry_name(&self.shared.ns, tokens);
        let Ok(index) = self.shared.index.lock() else { return };
        if index.contains(&name) {
            return;
        }
        drop(index);
        let c = &self.shared.counters;
        if c.pending.load(Relaxed) >= MAX_PENDING {
            c.write_skips.fetch_add(1, Relaxed);
            return;
        }
        let Some(tx) = &self.tx else { return };
        // The writer reads the bytes on its own thread: they must be there.
        if crate::owned_state::wait(&states).is_err() {
            return;
        }
        c.pending.fetch_add(1, Relaxed);
        if tx.send(WriteJob { name, tokens: tokens.to_vec(), trimmable, states }).is_err() {
            c.pending.fetch_sub(1, Relaxed);
        }
    }

    /// The stored entry sharing the longest usable prefix with `usable`
    /// when it beats the RAM tier's `ram` tokens, read back and checked; a
    /// file that fails its checks is deleted and counted, and the next
    /// best is tried. Files larger than `room` (what the RAM tier can hold)
    /// are not read.
    pub fn fetch(&self, usable: &[u32], ram: usize, room: u64) -> Option<Promoted> {
        let c = &self.shared.counters;
        loop {
            let best = self.shared.index.lock().ok()?.best(usable, ram, room);
            let Some((name, _)) = best else {
                c.misses.fetch_add(1, Relaxed);
                return None;
            };
            match io::read_entry(&self.shared.dir, &name, self.verify) {
                Ok(l) if l.header.namespace == self.shared.ns => {
                    let mut index = self.shared.index.lock().ok()?;
                    index.touch(&name);
                    c.hits.fetch_add(1, Relaxed);
                    return Some(Promoted { tokens: l.header.tokens, states: l.states, trimmable: l.header.trimmable });
                }
                Ok(_) => tracing::warn!("ssd cache: {name} belongs to another namespace"),
                Err(e) => tracing::warn!("ssd cache: rejecting {name}: {e}"),
            }
            c.rejected.fetch_add(1, Relaxed);
            let mut index = self.shared.index.lock().ok()?;
            index.remove(&name);
            self.shared.sync_sizes(&index);
        }
    }
}

impl Shared {
    fn write(&self, job: WriteJob) {
        let WriteJob { name, tokens, trimmable, states } = job;
        let c = &self.counters;
        // Larger than the whole cap: never stored.
        let cap = self.index.lock().map(|i| i.cap()).unwrap_or(0);
        let size: u64 = states
            .iter()
            .flat_map(|s| s.tensors.iter())
            .map(|t| unsafe { mlx_sys::mlx_array_nbytes(t.as_raw()) } as u64)
            .sum();
        if size > cap {
            c.write_skips.fetch_add(1, Relaxed);
            return;
        }
        match io::write_entry(&self.dir, &name, &self.ns, &tokens, trimmable, &states) {
            Ok(bytes) => {
                drop(states);
                let Ok(mut index) = self.index.lock() else { return };
                let evicted =
                    index.add(DiskEntry { name, tokens, trimmable, bytes, used: std::time::SystemTime::now() });
                c.evictions.fetch_add(evicted, Relaxed);
                c.writes.fetch_add(1, Relaxed);
                self.sync_sizes(&index);
            }
            Err(e) => {
                tracing::warn!("ssd cache: writing {name}: {e}");
                let _ = std::fs::remove_file(self.dir.join(format!("{name}.{}", format::TMP_EXT)));
                c.write_errors.fetch_add(1, Relaxed);
            }
        }
    }
}

impl Drop for SsdTier {
    /// Finishes the queued writes before the engine goes.
    fn drop(&mut self) {
        self.tx.take();
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}
