//! Per-row holes: columns a row does not use, left by a batched speculative
//! round whose rows kept different numbers of tokens.
//!
//! One write index serves every row, so after a round that appended `k + 1`
//! columns, a row that kept fewer than the most-keeping row has dead columns
//! at the end of its round. Instead of moving that row's tensors (a copy of
//! its whole cache every round), the columns are recorded as a hole: masks
//! hide them and the row's RoPE position counts only live tokens. Exports
//! and extracted rows are compact (holes squeezed out), and the storage is
//! compacted once holes cost more than `COMPACT_AFTER` columns in some row.

use model_kit::Array;
use model_kit::Result;
use plugin_sdk::mlx_rs;

/// Columns of holes in one row after which the cache is compacted.
pub const COMPACT_AFTER: usize = 64;

/// Half-open column ranges, sorted, per row.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Holes(pub Vec<Vec<(usize, usize)>>);

impl Holes {
    pub fn none(rows: usize) -> Self {
        Self(vec![Vec::new(); rows])
    }

    pub fn any(&self) -> bool {
        self.0.iter().any(|r| !r.is_empty())
    }

    /// Dead columns in row `r`.
    pub fn count(&self, r: usize) -> usize {
        self.0.get(r).map_or(0, |h| h.iter().map(|(a, b)| b - a).sum())
    }

    pub fn max_count(&self) -> usize {
        (0..self.0.len()).map(|r| self.count(r)).max().unwrap_or(0)
    }

    pub fn add(&mut self, r: usize, start: usize, end: usize) {
        if end > start {
            self.0[r].push((start, end));
        }
    }

    /// Forgets columns at or past `idx` (after a trim).
    pub fn cut(&mut self, idx: usize) {
        for row in &mut self.0 {
            row.retain(|&(a, _)| a < idx);
            for h in row.iter_mut() {
                h.1 = h.1.min(idx);
            }
        }
    }

    /// Shifts every range left by `n` columns (dropped common padding).
    pub fn shift_left(&mut self, n: usize) {
        for row in &mut self.0 {
            for h in row.iter_mut() {
                *h = (h.0 - n, h.1 - n);
            }
        }
    }

    /// Shifts every range right by `n` columns (padding added in front).
    pub fn shift_right(&mut self, n: usize) {
        for row in &mut self.0 {
            for h in row.iter_mut() {
                *h = (h.0 + n, h.1 + n);
            }
        }
    }

    pub fn is_live(&self, r: usize, c: usize) -> bool {
        !self.0[r].iter().any(|&(a, b)| c >= a && c < b)
    }

    /// Live columns of row `r` among `[from, to)`, in order.
    pub fn live_columns(&self, r: usize, from: usize, to: usize) -> Vec<i32> {
        (from..to).filter(|&c| self.is_live(r, c)).map(|c| c as i32).collect()
    }

    /// `[B, 1, 1, total]` true where a column is live (combined with the
    /// causal and padding masks by the caller).
    pub fn live_mask(&self, total: usize) -> Array {
        let b = self.0.len();
        let mut v = vec![true; b * total];
        for (r, row) in self.0.iter().enumerate() {
            for &(a, e) in row {
                for c in a..e.min(total) {
                    v[r * total + c] = false;
                }
            }
        }
        Array::from_slice(&v, &[b as i32, 1, 1, total as i32])
    }
}

/// Gather indices that squeeze the holes and padding out of `[B, H, idx, D]`
/// storage: row r becomes `new_pad[r]` filler columns (column 0, masked)
/// then its live columns, right-aligned to a common length.
pub fn compact_plan(holes: &Holes, left_pad: &[usize], idx: usize) -> (Vec<Vec<i32>>, Vec<usize>) {
    let live: Vec<Vec<i32>> = (0..left_pad.len()).map(|r| holes.live_columns(r, left_pad[r], idx)).collect();
    let len = live.iter().map(Vec::len).max().unwrap_or(0);
    let pads: Vec<usize> = live.iter().map(|l| len - l.len()).collect();
    let rows = live.into_iter().zip(&pads).map(|(l, &p)| std::iter::repeat_n(0, p).chain(l).collect()).collect();
    (rows, pads)
}

/// `a[B, H, *, D]` gathered along axis 2 by per-row indices (equal lengths).
pub fn gather_columns(a: &Array, rows: &[Vec<i32>]) -> Result<Array> {
    let (b, len) = (rows.len() as i32, rows.first().map_or(0, Vec::len) as i32);
    let flat: Vec<i32> = rows.iter().flatten().copied().collect();
    let idx = Array::from_slice(&flat, &[b, 1, len, 1]);
    let s = a.shape();
    let idx = mlx_rs::ops::broadcast_to(&idx, &[b, s[1], len, s[3]])?;
    a.take_along_axis(&idx, 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holes_count_cut_and_compact() {
        let mut h = Holes::none(2);
        h.add(0, 5, 7);
        h.add(0, 9, 10);
        assert_eq!(h.count(0), 3);
        assert!(!h.is_live(0, 6) && h.is_live(0, 7) && h.is_live(1, 6));
        let (rows, pads) = compact_plan(&h, &[1, 0], 10);
        // Row 0: columns 1..10 minus {5, 6, 9} = 6 live; row 1: 10 live.
        assert_eq!(pads, vec![4, 0]);
        assert_eq!(rows[0], vec![0, 0, 0, 0, 1, 2, 3, 4, 7, 8]);
        h.cut(6);
        assert_eq!(h.0[0], vec![(5, 6)]);
        h.shift_left(2);
        assert_eq!(h.0[0], vec![(3, 4)]);
    }
}
