//! The CPU time constrained decoding costs, over every matcher of a model.

use std::sync::atomic::{AtomicU64, Ordering};

/// CPU time the grammars take, over every matcher of one model (reported
/// in /metrics: what constrained decoding costs per step): computing masks,
/// and moving matchers past tokens.
#[derive(Debug, Default)]
pub struct MaskClock {
    masks: AtomicU64,
    mask_nanos: AtomicU64,
    accept_nanos: AtomicU64,
}

impl MaskClock {
    pub(crate) fn record_mask(&self, took: std::time::Duration) {
        self.masks.fetch_add(1, Ordering::Relaxed);
        self.mask_nanos.fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
    }

    pub(crate) fn record_accept(&self, took: std::time::Duration) {
        self.accept_nanos.fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
    }

    /// Masks computed, the seconds they took, and the seconds spent
    /// accepting tokens.
    pub fn totals(&self) -> (u64, f64, f64) {
        let s = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64 / 1e9;
        (self.masks.load(Ordering::Relaxed), s(&self.mask_nanos), s(&self.accept_nanos))
    }
}
