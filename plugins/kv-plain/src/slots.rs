//! Rows in slots: the storage keeps one slot per row it has held, so rows
//! that leave and join move single rows instead of copying the batch.
//!
//! - A leave: the host orders `keep` so that rows after the last kept slot
//!   fill the freed ones; each such row is read out, then written into its
//!   new slot. The slots past the kept rows stay allocated for joiners.
//! - A join: the joiner's columns go into the next free slot, right-aligned
//!   at the write index (its padding columns hold whatever the slot held
//!   before; the mask hides them).
//! - Columns that are padding in every row are skipped by moving `base`,
//!   not squeezed out by a copy; the storage drops them (and free slots)
//!   when it next grows.
//!
//! Slice updates write in place when MLX can donate the storage (nothing
//! else holds it). A join's columns come from the joiner's own caches, so a
//! join writes in place once the running step is read. A leave's moved rows
//! are read from the storage in the same evaluation as their writes, and
//! MLX keeps a buffer its pending readers use, so the first write copies
//! the storage once (as a leave always did); evaluating the reads first to
//! avoid that copy made the server slower on the CPU (44.6, 44.7 against
//! 46.6, 47.6 tok/s at 16 clients): it stalls the queued step.

use super::*;

/// Above this share of moved rows a leave copies the batch instead (the
/// copy also squeezes the padding out).
const MOST_ROWS_MOVE: f64 = 0.5;

impl PlainKv {
    /// Keeps rows `keep` (in that order) by moving only the rows whose slot
    /// changes; false when the caller should copy instead.
    pub(super) fn filter_in_place(&mut self, keep: &[u32]) -> Result<bool> {
        let Some(slots) = self.keys.as_ref().map(|k| k.shape()[0] as usize) else { return Ok(false) };
        if keep.is_empty() || keep.len() > slots || self.idx == 0 {
            return Ok(false);
        }
        let moved: Vec<(usize, i32)> =
            keep.iter().enumerate().filter(|&(i, &r)| r as usize != i).map(|(i, &r)| (i, r as i32)).collect();
        if moved.len() as f64 > keep.len() as f64 * MOST_ROWS_MOVE {
            return Ok(false);
        }
        if !moved.is_empty() {
            let (mut k, mut v) = (self.keys.take().unwrap(), self.values.take().unwrap());
            let src: Vec<i32> = moved.iter().map(|&(_, r)| r).collect();
            let sel = Array::from_slice(&src, &[src.len() as i32]);
            let rows_k = columns_to(&k, self.idx)?.take_axis(&sel, 0)?;
            let rows_v = columns_to(&v, self.idx)?.take_axis(&sel, 0)?;
            for (j, &(slot, _)) in moved.iter().enumerate() {
                k = put_row(&k, &rows_k, j, slot, self.idx)?;
                v = put_row(&v, &rows_v, j, slot, self.idx)?;
            }
            self.keys = Some(k);
            self.values = Some(v);
        }
        self.left_pad = keep.iter().map(|&r| self.left_pad[r as usize]).collect();
        self.holes = Holes(keep.iter().map(|&r| self.holes.0[r as usize].clone()).collect());
        self.base = self.left_pad.iter().copied().min().unwrap_or(0).max(self.base);
        Ok(true)
    }

    /// Writes 1-row caches `new` into free slots; false when the storage
    /// has too few free slots or a joiner does not fit left of the write
    /// index (the caller then copies).
    pub(super) fn merge_in_place(&mut self, new: &[PlainKv]) -> Result<bool> {
        let Some(slots) = self.keys.as_ref().map(|k| k.shape()[0] as usize) else { return Ok(false) };
        let first = self.rows();
        if first == 0 || first + new.len() > slots || new.iter().any(|r| r.idx > self.idx || r.holes.any()) {
            return Ok(false);
        }
        let (mut k, mut v) = (self.keys.take().unwrap(), self.values.take().unwrap());
        for (j, r) in new.iter().enumerate() {
            if let (Some(rk), Some(rv), true) = (&r.keys, &r.values, r.idx > 0) {
                let from = self.idx - r.idx;
                k = write_row(&k, &columns_to(rk, r.idx)?, first + j, from)?;
                v = write_row(&v, &columns_to(rv, r.idx)?, first + j, from)?;
            }
            let pad = self.idx - r.idx + r.left_pad[0];
            self.base = self.base.min(pad);
            self.left_pad.push(pad);
            self.holes.0.push(Vec::new());
        }
        self.keys = Some(k);
        self.values = Some(v);
        Ok(true)
    }
}

/// Storage `a` with slot `slot`'s first `cols` columns replaced by row `j`
/// of `rows` (`[n, H, cols, D]`).
fn put_row(a: &Array, rows: &Array, j: usize, slot: usize, cols: usize) -> Result<Array> {
    let s = rows.shape();
    let row = slice(rows, &[j as i32, 0, 0, 0], &[j as i32 + 1, s[1], cols as i32, s[3]])?;
    write_row(a, &row, slot, 0)
}

/// Storage `a` with `row` (`[1, H, n, D]`) written into slot `slot` at
/// columns `from .. from + n`.
fn write_row(a: &Array, row: &Array, slot: usize, from: usize) -> Result<Array> {
    let s = row.shape();
    let (slot, from) = (slot as i32, from as i32);
    slice_update(a, row, &[slot, 0, from, 0], &[slot + 1, s[1], from + s[2], s[3]])
}
