//! Memory admission: what a request will cost before it runs.
//!
//! need(request) = weights + KV(prompt + max_tokens) + transient, where
//! weights are measured (MLX's active memory after the weights were read),
//! KV per token is what the composed cache layouts declare
//! (`bytes_per_token`), and transient is an estimate of one prefill chunk's
//! activations plus a logits row. A request that can never fit is refused
//! with its numbers; one that fits but not beside the rows already running
//! waits (the scheduler holds it until rows finish).

use crate::engine::Engine;

const GIB: f64 = (1u64 << 30) as f64;

#[derive(Debug, Clone, Copy)]
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
}

#[derive(Debug, Clone, Copy)]
pub struct Budget {
    /// Everything: weights + all running requests' KV + transients.
    pub memory_bytes: u64,
    /// Optional cap on the KV of all running rows together.
    pub kv_bytes: Option<u64>,
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
        let kv = engine
            .new_caches()
            .map(|cs| cs.iter().map(|c| c.bytes_per_token()).sum::<u64>())
            .unwrap_or(0)
            + engine.draft_kv_bytes_per_token;
        let state_bytes = engine.model.plan.layers.iter().flat_map(|l| l.state_shapes.iter()).map(|s| s.iter().product::<i64>().max(0) as u64 * 4).sum();
        Self {
            weights_bytes: crate::runtime::active_memory() as u64,
            kv_bytes_per_token: kv,
            state_bytes,
            hidden: engine.model.plan.hidden_size as u64,
            vocab: engine.model.plan.vocab_size as u64,
            prefill_step: engine.prefill_step as u64,
            max_context: engine.model.plan.max_context as u64,
        }
    }

    /// One request of `tokens` total (prompt + max_tokens).
    pub fn need(&self, prompt: u64, tokens: u64) -> Need {
        // Activations of one prefill chunk (residual, q/k/v, MLP, norms: a
        // generous 16 hidden-sized f32 vectors per token) and a logits row.
        let chunk = prompt.min(self.prefill_step).max(1);
        Need { kv: tokens * self.kv_bytes_per_token + self.state_bytes, transient: chunk * self.hidden * 4 * 16 + self.vocab * 4 * 2 }
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
            let mid = (lo + hi + 1) / 2;
            if self.refuse(budget, mid.min(self.prefill_step), mid).is_none() {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        lo
    }

    /// Whether a request fits beside running rows that reserved `reserved` KV
    /// bytes and `transient` bytes.
    pub fn fits_now(&self, budget: &Budget, reserved_kv: u64, need: Need) -> bool {
        let kv_ok = budget.kv_bytes.is_none_or(|cap| reserved_kv + need.kv <= cap);
        kv_ok && self.weights_bytes + reserved_kv + need.kv + need.transient <= budget.memory_bytes
    }
}

/// 75% of the machine's memory (MemTotal), the default budget.
pub fn default_memory_budget() -> u64 {
    let total_kib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| m.lines().find(|l| l.starts_with("MemTotal:")).and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok()))
        .unwrap_or(8 << 20);
    total_kib * 1024 / 4 * 3
}

pub fn gib(bytes: u64) -> f64 {
    bytes as f64 / GIB
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> MemoryModel {
        MemoryModel { weights_bytes: 1 << 30, kv_bytes_per_token: 1 << 20, state_bytes: 0, hidden: 1024, vocab: 32_000, prefill_step: 2048, max_context: 0 }
    }

    #[test]
    fn refuses_what_can_never_fit_and_says_how_much_it_needs() {
        let m = model();
        let b = Budget { memory_bytes: 2 << 30, kv_bytes: None };
        assert!(m.refuse(&b, 100, 500).is_none());
        let why = m.refuse(&b, 100, 2000).unwrap();
        assert!(why.contains("needs 2.") && why.contains("memory budget of 2.00 GiB"), "{why}");
        let kv = Budget { memory_bytes: 64 << 30, kv_bytes: Some(100 << 20) };
        assert!(m.refuse(&kv, 10, 101).unwrap().contains("KV budget"));
        assert!(m.refuse(&kv, 10, 99).is_none());
    }

    #[test]
    fn largest_fit_is_the_boundary() {
        let m = model();
        let b = Budget { memory_bytes: 2 << 30, kv_bytes: None };
        let n = m.max_tokens_that_fit(&b);
        assert!(m.refuse(&b, n.min(2048), n).is_none());
        assert!(m.refuse(&b, (n + 1).min(2048), n + 1).is_some());
    }

    #[test]
    fn waiting_depends_on_what_runs() {
        let m = model();
        let b = Budget { memory_bytes: 64 << 30, kv_bytes: Some(1000 << 20) };
        let need = m.need(10, 600);
        assert!(m.fits_now(&b, 0, need));
        assert!(!m.fits_now(&b, 500 << 20, need));
    }
}
