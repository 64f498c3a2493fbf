//! Lock-free Prometheus-style histograms for the engine's per-request
//! timings (time to first token, prefill and decode rates).

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Cumulative bucket counts for fixed upper bounds, plus count and sum.
#[derive(Default)]
pub struct Histogram {
    buckets: [AtomicU64; 12],
    count: AtomicU64,
    /// Sum of observations in millionths (atomics hold integers).
    sum_micro: AtomicU64,
}

/// Upper bounds, in the unit of each histogram.
pub const TTFT_SECONDS: &[f64] = &[0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];
pub const TOKENS_PER_SECOND: &[f64] =
    &[1.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0];

impl Histogram {
    pub fn observe(&self, bounds: &[f64], v: f64) {
        for (b, le) in self.buckets.iter().zip(bounds) {
            if v <= *le {
                b.fetch_add(1, Relaxed);
            }
        }
        self.count.fetch_add(1, Relaxed);
        self.sum_micro.fetch_add((v.max(0.0) * 1e6) as u64, Relaxed);
    }

    /// The buckets, then count and sum: what [`Histogram::load`] takes back.
    pub fn snapshot(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.buckets.iter().map(|b| b.load(Relaxed)).collect();
        v.extend([self.count.load(Relaxed), self.sum_micro.load(Relaxed)]);
        v
    }

    /// Overwrites every counter with a snapshot's (another process's histogram).
    pub fn load(&self, v: &[u64]) {
        let cells = self.buckets.iter().chain([&self.count, &self.sum_micro]);
        for (cell, &x) in cells.zip(v) {
            cell.store(x, Relaxed);
        }
    }

    pub fn count(&self) -> u64 {
        self.count.load(Relaxed)
    }

    /// The histogram in Prometheus text format under `name`.
    pub fn render(&self, out: &mut String, name: &str, help: &str, bounds: &[f64]) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (b, le) in self.buckets.iter().zip(bounds) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {}", b.load(Relaxed));
        }
        let n = self.count();
        let _ = writeln!(
            out,
            "{name}_bucket{{le=\"+Inf\"}} {n}\n{name}_sum {}\n{name}_count {n}",
            self.sum_micro.load(Relaxed) as f64 / 1e6
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_cumulative_and_render_in_prometheus_format() {
        let h = Histogram::default();
        for v in [0.01, 0.2, 0.2, 7.0, 99.0] {
            h.observe(TTFT_SECONDS, v);
        }
        let mut s = String::new();
        h.render(&mut s, "x", "help", TTFT_SECONDS);
        assert!(s.contains("x_bucket{le=\"0.025\"} 1\n"), "{s}");
        assert!(s.contains("x_bucket{le=\"0.25\"} 3\n"), "{s}");
        assert!(s.contains("x_bucket{le=\"10\"} 4\n"), "{s}");
        assert!(s.contains("x_bucket{le=\"+Inf\"} 5\n"), "{s}");
        assert!(s.contains("x_sum 106.41\n") && s.contains("x_count 5\n"), "{s}");
    }
}
