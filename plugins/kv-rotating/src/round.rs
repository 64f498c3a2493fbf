//! Speculative rounds of the batched ring, where each row keeps its own
//! count (mlx-lm has no batched speculation; the pieces are its own).
//!
//! A batched round is one update of `[B, k+1]` tokens. After a multi-token
//! update the storage is in temporal order with the round's columns last,
//! so dropping rejected tokens is a trim of the columns no row keeps, then,
//! for a row that kept fewer than the most-keeping row, a roll of its
//! storage to the right by the difference: its dead columns come round to
//! the front and become left padding, its offset goes back by as many.
//! That is how mlx-lm's `finalize` turns right padding into left padding.
//! Each row then holds exactly what it would hold had it never seen the
//! rejected tokens: the concat kept `max_size - 1` columns before the round,
//! and the window needs `window - 1` of them at most. A round in which no
//! row keeps anything restores the snapshot taken at `spec_begin`.

use crate::batch::{BatchRotatingKv, Round};
use crate::cols;
use model_kit::{Array, Result};
use plugin_api::PluginError;
use plugin_sdk::mlx_error;

/// Each row of `a` `[B, H, n, D]` rolled right along axis 2 by `shifts[r]`
/// (mlx-lm `dynamic_roll`).
fn roll_rows(a: &Array, shifts: &[usize]) -> Result<Array> {
    let s = a.shape();
    let n = s[2] as usize;
    let idx: Vec<i32> =
        shifts.iter().flat_map(|&d| (0..n).map(move |j| ((j + n - d % n.max(1)) % n.max(1)) as i32)).collect();
    let idx = Array::from_slice(&idx, &[s[0], 1, s[2], 1]);
    let idx = plugin_sdk::mlx_rs::ops::broadcast_to(&idx, s)?;
    a.take_along_axis(&idx, 2)
}

impl BatchRotatingKv {
    pub fn spec_begin(&mut self) -> std::result::Result<(), PluginError> {
        self.round = Some(Round { snapshot: self.snapshot(), updates: 0, appended: 0 });
        Ok(())
    }

    /// Keeps `keep[r]` (one count for all rows, or one per row) of the
    /// tokens appended since `spec_begin`.
    pub fn rollback(&mut self, keep: &[u64]) -> std::result::Result<(), PluginError> {
        let round = self.round.take().ok_or_else(|| PluginError::invalid_input("spec_rollback without spec_begin"))?;
        if keep.is_empty() || (keep.len() != 1 && keep.len() != self.rows()) {
            return Err(PluginError::invalid_input(format!(
                "spec_rollback: {} keep counts for {} rows",
                keep.len(),
                self.rows()
            )));
        }
        let kept: Vec<usize> = (0..self.rows())
            .map(|r| (keep[if keep.len() == 1 { 0 } else { r }] as usize).min(round.appended))
            .collect();
        let most = kept.iter().copied().max().unwrap_or(0);
        if kept.iter().all(|&k| k == round.appended) {
            return Ok(());
        }
        if most == 0 {
            self.restore(round.snapshot);
            return Ok(());
        }
        if round.updates != 1 {
            return Err(PluginError::unsupported(format!(
                "kv-rotating: a batched round is one update; {} updates cannot be rolled back per row",
                round.updates
            )));
        }
        self.drop_tail(round.appended - most, &kept, most).map_err(mlx_error)
    }

    /// Trims the `tail` columns no row keeps, then rolls each row that kept
    /// fewer than `most` right by the difference.
    fn drop_tail(&mut self, tail: usize, kept: &[usize], most: usize) -> Result<()> {
        self.linear()?;
        let end = self.idx - tail;
        let shifts: Vec<usize> = kept.iter().map(|&k| most - k).collect();
        let any = shifts.iter().any(|&d| d > 0);
        if let (Some(k), Some(v)) = (self.keys.take(), self.values.take()) {
            let (k, v) = (cols(&k, 0, end)?, cols(&v, 0, end)?);
            self.keys = Some(if any { roll_rows(&k, &shifts)? } else { k });
            self.values = Some(if any { roll_rows(&v, &shifts)? } else { v });
        }
        self.idx = end;
        self.seen -= tail;
        for (r, &d) in shifts.iter().enumerate() {
            self.left_pad[r] += d;
            self.offsets[r] -= (tail + d) as i64;
        }
        Ok(())
    }
}
