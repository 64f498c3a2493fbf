//! Counters for observability (`/stats`, `/metrics`) and for tests that
//! watch the engine (cancellation, batching, cohorts, speculative replays).

use crate::engine::Engine;
use crate::histogram::{Histogram, TOKENS_PER_SECOND, TTFT_SECONDS};
use crate::job::GenerateResult;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Counters for observability (and for tests that watch cancellation).
#[derive(Default)]
pub struct Stats {
    pub queued: AtomicU64,
    pub active: AtomicU64,
    pub requests: AtomicU64,
    pub completed: AtomicU64,
    /// Jobs stopped by their caller (client gone, stop string, shutdown).
    pub cancelled: AtomicU64,
    pub failed: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub generated_tokens: AtomicU64,
    /// Tokens the most recently cancelled job had produced when it stopped.
    pub last_cancelled_tokens: AtomicU64,
    /// Decode steps run, and the most rows any one of them carried.
    pub decode_steps: AtomicU64,
    pub max_batch_rows: AtomicU64,
    /// Decode steps built before the previous step's tokens were read.
    pub pipelined_steps: AtomicU64,
    /// Batched speculative rounds whose rollback replayed the kept tokens
    /// (recurrent state), and those among them whose rows kept different
    /// counts (replayed with per-row padding).
    pub spec_replays: AtomicU64,
    pub spec_replays_padded: AtomicU64,
    /// Cohort prefills run, and the rows they carried.
    pub cohorts: AtomicU64,
    pub cohort_rows: AtomicU64,
    /// Per-request time to first token (seconds), prefill rate (prompt
    /// tokens / time to first token) and decode rate (tokens/s after the
    /// first), as histograms; the last finished request's rates as gauges.
    pub ttft: Histogram,
    pub prefill_rate: Histogram,
    pub decode_rate: Histogram,
    pub last_prefill_tps: AtomicU64,
    pub last_decode_tps: AtomicU64,
    /// Prefix cache counters, copied from the engine after each request.
    pub prefix_hits: AtomicU64,
    pub prefix_misses: AtomicU64,
    pub prefix_hit_tokens: AtomicU64,
    pub prefix_bytes: AtomicU64,
    pub prefix_entries: AtomicU64,
    /// Requests refused because they can never fit in memory.
    pub admission_refusals: AtomicU64,
    /// KV bytes reserved by the batch's rows and joiners now (as the
    /// layouts hold batched rows: every row as wide as the widest).
    pub kv_reserved: AtomicU64,
    /// Running requests' states stored for resuming (`--generation-checkpoint`).
    pub generation_checkpoints: AtomicU64,
    /// The engine's loop waits for work with nothing left on the device
    /// (a step queued ahead of rows that all finished has run and its
    /// buffers are freed) and MLX's buffer cache returned: what it holds
    /// now is the weights and the prefix cache.
    pub idle: AtomicBool,
    /// The K/V block pool (`--paged-kv`), copied from the engine each
    /// batch iteration and after each request: tokens per block (0: no
    /// pool), distinct blocks, block-table references to them, their
    /// bytes, and tokens in rows' private tails.
    pub kv_block_tokens: AtomicU64,
    pub kv_blocks: AtomicU64,
    pub kv_block_references: AtomicU64,
    pub kv_block_bytes: AtomicU64,
    pub kv_tail_tokens: AtomicU64,
    /// The SSD tier's live counters, when the engine has one.
    pub ssd: Option<std::sync::Arc<crate::ssd_cache::SsdCounters>>,
}

/// The counters that travel from an isolated engine to the API process
/// (`admission_refusals` stays: the API process counts it).
macro_rules! mirrored {
    ($apply:ident) => {
        $apply!(
            queued,
            active,
            requests,
            completed,
            cancelled,
            failed,
            prompt_tokens,
            generated_tokens,
            last_cancelled_tokens,
            decode_steps,
            max_batch_rows,
            pipelined_steps,
            spec_replays,
            spec_replays_padded,
            cohorts,
            cohort_rows,
            last_prefill_tps,
            last_decode_tps,
            prefix_hits,
            prefix_misses,
            prefix_hit_tokens,
            prefix_bytes,
            prefix_entries,
            kv_reserved,
            generation_checkpoints,
            kv_block_tokens,
            kv_blocks,
            kv_block_references,
            kv_block_bytes,
            kv_tail_tokens
        )
    };
}

/// Everything [`Stats`] holds, as plain numbers (for another process).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StatsSnapshot {
    pub counters: Vec<u64>,
    pub histograms: [Vec<u64>; 3],
    pub idle: bool,
    pub ssd: Option<Vec<u64>>,
}

impl Stats {
    pub fn snapshot(&self) -> StatsSnapshot {
        macro_rules! read {
            ($($f:ident),*) => { vec![$(self.$f.load(Ordering::Relaxed)),*] };
        }
        StatsSnapshot {
            counters: mirrored!(read),
            histograms: [self.ttft.snapshot(), self.prefill_rate.snapshot(), self.decode_rate.snapshot()],
            idle: self.idle.load(Ordering::Relaxed),
            ssd: self.ssd.as_ref().map(|c| c.snapshot()),
        }
    }

    /// Overwrites the mirrored counters with `s` (an isolated engine's).
    pub fn load(&self, s: &StatsSnapshot) {
        let mut values = s.counters.iter().copied();
        macro_rules! write {
            ($($f:ident),*) => { $( if let Some(v) = values.next() { self.$f.store(v, Ordering::Relaxed); } )* };
        }
        mirrored!(write);
        self.ttft.load(&s.histograms[0]);
        self.prefill_rate.load(&s.histograms[1]);
        self.decode_rate.load(&s.histograms[2]);
        self.idle.store(s.idle, Ordering::Relaxed);
        if let (Some(c), Some(v)) = (&self.ssd, &s.ssd) {
            c.load(v);
        }
    }

    /// Records a finished request's timings and the engine's cache counters.
    pub(crate) fn record(&self, r: &GenerateResult, engine: &Engine) {
        self.ttft.observe(TTFT_SECONDS, r.prefill_s);
        self.prefill_rate.observe(TOKENS_PER_SECOND, r.prefill_tps());
        if r.tokens.len() >= 2 {
            self.decode_rate.observe(TOKENS_PER_SECOND, r.decode_tps());
        }
        self.last_prefill_tps.store(r.prefill_tps().to_bits(), Ordering::Relaxed);
        self.last_decode_tps.store(r.decode_tps().to_bits(), Ordering::Relaxed);
        self.sync_prefix(engine);
        self.sync_pool(engine);
    }

    /// Copies the block pool's counts (nothing without a pool).
    pub(crate) fn sync_pool(&self, engine: &Engine) {
        if let Some(u) = engine.kv_pool() {
            self.kv_block_tokens.store(u.block_tokens as u64, Ordering::Relaxed);
            self.kv_blocks.store(u.blocks, Ordering::Relaxed);
            self.kv_block_references.store(u.references, Ordering::Relaxed);
            self.kv_block_bytes.store(u.bytes, Ordering::Relaxed);
            self.kv_tail_tokens.store(u.tail_tokens, Ordering::Relaxed);
        }
    }

    /// Copies the engine's prefix-cache counters.
    pub(crate) fn sync_prefix(&self, engine: &Engine) {
        let c = engine.prefix().counters();
        self.prefix_hits.store(c.hits, Ordering::Relaxed);
        self.prefix_misses.store(c.misses, Ordering::Relaxed);
        self.prefix_hit_tokens.store(c.hit_tokens, Ordering::Relaxed);
        self.prefix_bytes.store(c.bytes, Ordering::Relaxed);
        self.prefix_entries.store(c.entries, Ordering::Relaxed);
        self.generation_checkpoints.store(engine.checkpoints(), Ordering::Relaxed);
    }
}
