//! Memory admission: what a request will cost before it runs.
//!
//! need(request) = weights + KV(prompt + max_tokens) + transient, where
//! weights are measured (MLX's active memory after the weights were read),
//! KV per token is what the composed cache layouts declare
//! (`bytes_per_token`), and transient is an estimate of one prefill chunk's
//! activations plus a logits row. A request that can never fit is refused
//! with its numbers; one that fits but not beside the rows already running
//! waits (the scheduler holds it until rows finish).
//!
//! Beside running work, the budget also pays for MLX's buffer cache (its
//! limit) and the prefix cache (its entries' real bytes); the prefix cache
//! gets what is left (`prefix_room`) and gives bytes back, oldest entries
//! first, when a request needs them. Batched rows are reserved as the
//! layouts hold them: every row as wide as the widest (left padding), in
//! whole growth steps (`batch_kv`); layers whose K/V live in a block pool
//! (`--paged-kv`) by blocks instead (`paged_kv`): the pool's blocks held
//! now, shared ones once, and the blocks each row still has to fill.

use crate::engine::Engine;

const GIB: f64 = (1u64 << 30) as f64;

#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, Copy)]
pub struct MemoryModel {
    pub weights_bytes: u64,
    pub kv_bytes_per_token: u64,
    /// Fixed per-request state (recurrent layers: conv + SSM state), from
    /// the plan's `state_shapes`, counted at 4 bytes per element (an upper
    /// bound: f32 or narrower).
    pub state_bytes: u64,
    pub hidden: u64,
    pub vocab: u64,
    pub prefill_step: u64,
    pub max_context: u64,
    /// The layers whose K/V live in a block pool, if any.
    pub paged: Option<PagedKv>,
}

/// The block-pool part of a model's K/V.
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct PagedKv {
    pub block_tokens: u64,
    /// Bytes per token of the paged layers (a part of `kv_bytes_per_token`).
    pub bytes_per_token: u64,
}

#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, Copy)]
pub struct Budget {
    /// Everything: weights + all running requests' KV + transients + MLX's
    /// buffer cache + the prefix cache.
    pub memory_bytes: u64,
    /// Optional cap on the KV of all running rows together.
    pub kv_bytes: Option<u64>,
    /// MLX's buffer cache limit (freed buffers kept for reuse).
    pub mlx_cache_bytes: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Need {
    pub kv: u64,
    pub transient: u64,
}

impl MemoryModel {
    /// Measures the served model: weights as MLX holds them now, KV from a
    /// fresh one-row cache set.
    pub fn measure(engine: &Engine) -> Self {
        // A draft model's caches grow with the target's (each drafting
        // request, serial or batched row, holds its own).
        let kv = engine.kv_bytes_per_token();
        let state_bytes = engine
            .model()
            .plan
            .layers
            .iter()
            .flat_map(|l| l.state_shapes.iter())
            .map(|s| s.iter().product::<i64>().max(0) as u64 * 4)
            .sum();
        Self {
            weights_bytes: crate::runtime::active_memory() as u64,
            kv_bytes_per_token: kv,
            state_bytes,
            hidden: engine.model().plan.hidden_size as u64,
            vocab: engine.model().plan.vocab_size as u64,
            prefill_step: engine.prefill_step() as u64,
            max_context: engine.model().plan.max_context as u64,
            paged: engine.paged_kv().map(|(block_tokens, bytes_per_token)| PagedKv { block_tokens, bytes_per_token }),
        }
    }

    /// One request of `tokens` total (prompt + max_tokens).
    pub fn need(&self, prompt: u64, tokens: u64) -> Need {
        // Activations of one prefill chunk (residual, q/k/v, MLP, norms: a
        // generous 16 hidden-sized f32 vectors per token) and a logits row.
        let chunk = prompt.min(self.prefill_step).max(1);
        Need {
            kv: tokens * self.kv_bytes_per_token + self.state_bytes,
            transient: chunk * self.hidden * 4 * 16 + self.vocab * 4 * 2,
        }
    }

    /// Why a request can never run under `budget`, if it cannot.
    pub fn refuse(&self, budget: &Budget, prompt: u64, tokens: u64) -> Option<String> {
        let n = self.need(prompt, tokens);
        let total = self.weights_bytes + n.kv + n.transient;
        if total > budget.memory_bytes {
            return Some(format!(
                "this request needs {:.2} GiB (weights {:.2} + KV for {tokens} tokens {:.2} + transient {:.2}), more than the server's memory budget of {:.2} GiB",
                total as f64 / GIB,
                self.weights_bytes as f64 / GIB,
                n.kv as f64 / GIB,
                n.transient as f64 / GIB,
                budget.memory_bytes as f64 / GIB
            ));
        }
        if let Some(kv) = budget.kv_bytes {
            if n.kv > kv {
                return Some(format!("this request's KV for {tokens} tokens needs {:.3} GiB, more than the server's KV budget of {:.3} GiB", n.kv as f64 / GIB, kv as f64 / GIB));
            }
        }
        None
    }

    /// The largest total token count one request may have under `budget`.
    pub fn max_tokens_that_fit(&self, budget: &Budget) -> u64 {
        let (mut lo, mut hi) = (0u64, 1u64 << 24);
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if self.refuse(budget, mid.min(self.prefill_step), mid).is_none() {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        lo
    }

    /// KV bytes of `rows` batched rows whose longest may reach `widest`
    /// tokens: left-padded rows are all as wide as the widest, and storage
    /// grows in whole steps of `step` tokens.
    pub fn batch_kv(&self, rows: u64, widest: u64, step: u64) -> u64 {
        let step = step.max(1);
        rows * (widest.div_ceil(step) * step * self.kv_bytes_per_token + self.state_bytes)
    }

    /// KV bytes of batched rows, given as (tokens they hold now, tokens
    /// they may reach), over a pool holding `pool_bytes` now: layers in the
    /// pool by blocks (what it holds, each shared block once, and the
    /// blocks each row has yet to fill up to its end), the other layers as
    /// `batch_kv` reserves them.
    pub fn paged_kv(&self, rows: &[(u64, u64)], pool_bytes: u64, step: u64) -> u64 {
        let Some(p) = self.paged else {
            let widest = rows.iter().map(|r| r.1).max().unwrap_or(0);
            return self.batch_kv(rows.len() as u64, widest, step);
        };
        let others = MemoryModel { kv_bytes_per_token: self.kv_bytes_per_token - p.bytes_per_token, ..*self };
        let widest = rows.iter().map(|r| r.1).max().unwrap_or(0);
        let bs = p.block_tokens.max(1);
        let to_fill: u64 = rows.iter().map(|&(now, end)| end.div_ceil(bs).saturating_sub(now / bs)).sum();
        others.batch_kv(rows.len() as u64, widest, step) + pool_bytes + to_fill * bs * p.bytes_per_token
    }

    /// Whether work whose KV takes `kv` bytes (running rows and the new
    /// one together) and whose largest transient is `transient` fits; the
    /// prefix cache does not count here (it gives its bytes back).
    pub fn fits_now(&self, budget: &Budget, kv: u64, transient: u64) -> bool {
        let kv_ok = budget.kv_bytes.is_none_or(|cap| kv <= cap);
        kv_ok && self.weights_bytes + budget.mlx_cache_bytes + kv + transient <= budget.memory_bytes
    }

    /// Bytes the prefix cache may hold beside work of `kv` KV bytes and
    /// `transient` transient bytes.
    pub fn prefix_room(&self, budget: &Budget, kv: u64, transient: u64) -> u64 {
        budget.memory_bytes.saturating_sub(self.weights_bytes + budget.mlx_cache_bytes + kv + transient)
    }
}

/// 75% of the default device's memory (a GPU's own, else RAM), the
/// default budget.
pub fn default_memory_budget() -> u64 {
    crate::runtime::device_memory() / 4 * 3
}

/// MLX's buffer cache limit when none is given: MLX's own default on the
/// CPU (32 MiB: cached CPU buffers are resident memory), and on a GPU a
/// sixteenth of the memory budget (MLX's own default there is 95% of the
/// device, which lets freed buffers crowd out everything else).
pub fn default_mlx_cache_limit(memory_budget: u64) -> u64 {
    match crate::runtime::default_device() {
        crate::runtime::DeviceKind::Cpu => 32 << 20,
        crate::runtime::DeviceKind::Gpu => memory_budget / 16,
    }
}

pub fn gib(bytes: u64) -> f64 {
    bytes as f64 / GIB
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> MemoryModel {
        MemoryModel {
            weights_bytes: 1 << 30,
            kv_bytes_per_token: 1 << 20,
            state_bytes: 0,
            hidden: 1024,
            vocab: 32_000,
            prefill_step: 2048,
            max_context: 0,
            paged: None,
        }
    }

    #[test]
    fn refuses_what_can_never_fit_and_says_how_much_it_needs() {
        let m = model();
        let b = Budget { memory_bytes: 2 << 30, kv_bytes: None, mlx_cache_bytes: 0 };
        assert!(m.refuse(&b, 100, 500).is_none());
        let why = m.refuse(&b, 100, 2000).unwrap();
        assert!(why.contains("needs 2.") && why.contains("memory budget of 2.00 GiB"), "{why}");
        let kv = Budget { memory_bytes: 64 << 30, kv_bytes: Some(100 << 20), mlx_cache_bytes: 0 };
        assert!(m.refuse(&kv, 10, 101).unwrap().contains("KV budget"));
        assert!(m.refuse(&kv, 10, 99).is_none());
    }

    #[test]
    fn largest_fit_is_the_boundary() {
        let m = model();
        let b = Budget { memory_bytes: 2 << 30, kv_bytes: None, mlx_cache_bytes: 0 };
        let n = m.max_tokens_that_fit(&b);
        assert!(m.refuse(&b, n.min(2048), n).is_none());
        assert!(m.refuse(&b, (n + 1).min(2048), n + 1).is_some());
    }

    #[test]
    fn waiting_depends_on_what_runs() {
        let m = model();
        let b = Budget { memory_bytes: 64 << 30, kv_bytes: Some(1000 << 20), mlx_cache_bytes: 0 };
        let need = m.need(10, 600);
        assert!(m.fits_now(&b, need.kv, need.transient));
        assert!(!m.fits_now(&b, (500 << 20) + need.kv, need.transient));
    }

    #[test]
    fn batched_rows_are_as_wide_as_the_widest_in_whole_steps() {
        let m = MemoryModel { state_bytes: 7, ..model() };
        // Three rows, the widest 300 tokens: 512 columns each (two steps of 256).
        assert_eq!(m.batch_kv(3, 300, 256), 3 * (512 * (1 << 20) + 7));
        assert_eq!(m.batch_kv(0, 300, 256), 0);
    }

    #[test]
    fn paged_rows_are_reserved_by_the_blocks_held_and_to_fill() {
        // Half of each token's bytes in paged layers, blocks of 16.
        let half = 1 << 19;
        let m = MemoryModel { paged: Some(PagedKv { block_tokens: 16, bytes_per_token: half }), ..model() };
        // Two rows holding 100 and 40 tokens, to reach 120 and 50; the pool
        // holds 7 blocks' worth now (shared ones once).
        let pool = 7 * 16 * half;
        let to_fill = (8 - 6) + (4 - 2);
        let others = 2 * (256 * half);
        assert_eq!(m.paged_kv(&[(100, 120), (40, 50)], pool, 256), others + pool + to_fill * 16 * half);
        // A new row (nothing held yet) counts all its blocks.
        assert_eq!(m.paged_kv(&[(0, 33)], 0, 256), 256 * half + 3 * 16 * half);
        // Without a pool: as batch_kv.
        assert_eq!(model().paged_kv(&[(100, 120), (40, 300)], 0, 256), model().batch_kv(2, 300, 256));
    }

    #[test]
    fn the_prefix_cache_gets_what_work_leaves() {
        let m = model();
        let b = Budget { memory_bytes: 4 << 30, kv_bytes: None, mlx_cache_bytes: 256 << 20 };
        // 4 GiB - 1 GiB weights - 256 MiB MLX cache - 1 GiB KV - 256 MiB transient.
        assert_eq!(
            m.prefix_room(&b, 1 << 30, 256 << 20),
            (4u64 << 30) - (1 << 30) - (256 << 20) - (1 << 30) - (256 << 20)
        );
        assert_eq!(m.prefix_room(&b, 8 << 30, 0), 0);
    }
}
