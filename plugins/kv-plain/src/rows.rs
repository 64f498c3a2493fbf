//! Rows joining and leaving a batch cache: 1-row states merged in
//! (left-padded to a common length), rows filtered out, one row extracted as
//! a state, one row's K/V lent to a drafter. The in-place paths for slots
//! are `slots.rs`; these are the copies taken when those do not apply.

use super::*;

impl PlainKv {
    /// Appends 1-row states, left-padding everyone to a common length: into
    /// free slots in place when they fit (`slots.rs`), else in one copy of
    /// the batch that keeps room for the next tokens (rows concatenated to
    /// exactly the merged length would make the next update regrow the
    /// buffer, a second copy of the whole batch at every join). Columns that
    /// are padding in every row are left out of a copy.
    pub(crate) fn merge(&mut self, rows: Vec<CacheState>) -> Result<()> {
        self.settle()?;
        let mut new_rows = Vec::new();
        for st in rows {
            let mut one = self.emptied(1);
            one.load(st)?;
            if one.rows() != 1 {
                return Err(error("merge_rows takes 1-row states"));
            }
            new_rows.push(one);
        }
        if self.merge_in_place(&new_rows)? {
            return Ok(());
        }
        let old = match (self.keys.take(), self.values.take()) {
            (Some(k), Some(v)) if self.rows() > 0 && self.idx > 0 => {
                Some((self.rows_in_use(&k)?, self.rows_in_use(&v)?))
            }
            _ => None,
        };
        let kept = old.is_some();
        let common = if kept { self.left_pad.iter().copied().min().unwrap_or(0) } else { 0 };
        let old_len = if kept { self.idx - common } else { 0 };
        let len = new_rows.iter().map(|r| r.idx).chain(std::iter::once(old_len)).max().unwrap_or(0);
        let (heads, kd, vd, dtype) = (self.heads, self.k_dim, self.v_dim, self.dtype);
        let spare = old.as_ref().map_or(0, |(k, _)| k.shape()[2] as usize - self.idx);
        let (keys, values) = match old {
            // The joiners fit under the batch's length: the batch, from its
            // first column in use to the end of its capacity, and each
            // joiner padded to that width.
            Some((k, v)) if len == old_len && spare > 0 => {
                let width = len + spare;
                let mut ks = vec![columns_from(&k, common)?];
                let mut vs = vec![columns_from(&v, common)?];
                for r in &new_rows {
                    ks.push(padded_row(r.keys.as_ref(), r.idx, len, width, heads, kd, dtype)?);
                    vs.push(padded_row(r.values.as_ref(), r.idx, len, width, heads, vd, dtype)?);
                }
                (mlx_rs::ops::concatenate(&ks, 0)?, mlx_rs::ops::concatenate(&vs, 0)?)
            }
            // Otherwise every row is written, right-aligned at `len`, into
            // zeros with `step`-rounded room.
            old => {
                let total = (self.rows() * usize::from(kept) + new_rows.len()) as i32;
                let cap = ((len / self.step + 1) * self.step) as i32;
                let mut keys = zeros(&[total, heads, cap, kd], dtype)?;
                let mut values = zeros(&[total, heads, cap, vd], dtype)?;
                let mut place = |k: Array, v: Array, r0: i32, r1: i32, n: usize| -> Result<()> {
                    let first = (len - n) as i32;
                    keys = slice_update(&keys, &k, &[r0, 0, first, 0], &[r1, heads, len as i32, kd])?;
                    values = slice_update(&values, &v, &[r0, 0, first, 0], &[r1, heads, len as i32, vd])?;
                    Ok(())
                };
                let mut row = 0;
                if let Some((k, v)) = old {
                    let (k, v) = (columns_to(&k, self.idx)?, columns_to(&v, self.idx)?);
                    let (k, v) = (columns_from(&k, common)?, columns_from(&v, common)?);
                    row = self.rows() as i32;
                    place(k, v, 0, row, old_len)?;
                }
                for r in &new_rows {
                    if let (Some(k), Some(v)) = (&r.keys, &r.values) {
                        place(columns_to(k, r.idx)?, columns_to(v, r.idx)?, row, row + 1, r.idx)?;
                    }
                    row += 1;
                }
                (keys, values)
            }
        };
        let mut pads = Vec::new();
        let mut holes = Holes::none(0);
        if kept {
            let shift = len - old_len;
            pads.extend(self.left_pad.iter().map(|p| p - common + shift));
            holes = self.holes.clone();
            holes.shift_left(common);
            holes.shift_right(shift);
        }
        for r in &new_rows {
            pads.push(len - r.idx + r.left_pad[0]);
            holes.0.push(Vec::new());
        }
        self.keys = Some(keys);
        self.values = Some(values);
        self.lent_upto.set(0);
        self.idx = len;
        self.base = 0;
        self.left_pad = pads;
        self.holes = holes;
        Ok(())
    }

    /// Keeps rows `keep`, in that order: by moving the rows whose slot
    /// changes, keeping the freed slots (`slots.rs`), else in one copy that leaves out the
    /// columns that are padding in every kept row and keeps the spare
    /// capacity, so the next update writes in place.
    pub(crate) fn filter(&mut self, keep: &[u32]) -> Result<()> {
        self.settle()?;
        if keep.iter().any(|&r| r as usize >= self.rows()) {
            return Err(error(format!("filter_rows: row out of range (rows = {})", self.rows())));
        }
        if self.filter_in_place(keep)? {
            return Ok(());
        }
        let idx: Vec<i32> = keep.iter().map(|&r| r as i32).collect();
        let sel = Array::from_slice(&idx, &[idx.len() as i32]);
        self.left_pad = keep.iter().map(|&r| self.left_pad[r as usize]).collect();
        self.holes = Holes(keep.iter().map(|&r| self.holes.0[r as usize].clone()).collect());
        let common = self.left_pad.iter().copied().min().unwrap_or(0);
        if let (Some(k), Some(v)) = (self.keys.take(), self.values.take()) {
            self.keys = Some(columns_from(&k, common)?.take_axis(&sel, 0)?);
            self.values = Some(columns_from(&v, common)?.take_axis(&sel, 0)?);
            self.lent_upto.set(0);
        }
        self.idx -= common;
        self.base = 0;
        self.left_pad.iter_mut().for_each(|p| *p -= common);
        self.holes.shift_left(common);
        Ok(())
    }

    /// Row r's live columns, from position 0 (what a drafter reads).
    pub(crate) fn view(&self, row: u32) -> Result<KvView> {
        let r = row as usize;
        if r >= self.rows() {
            return Err(error(format!("kv_view: row {r} out of range (rows = {})", self.rows())));
        }
        let (Some(k), Some(v)) = (&self.keys, &self.values) else {
            let (k, v) = (
                zeros(&[1, self.heads, 0, self.k_dim], self.dtype)?,
                zeros(&[1, self.heads, 0, self.v_dim], self.dtype)?,
            );
            return Ok(KvView { keys: into_tensor(k), values: into_tensor(v), first: 0 });
        };
        let (keys, values) = self.live_row(k, v, r)?;
        Ok(KvView { keys: into_tensor(keys), values: into_tensor(values), first: 0 })
    }

    /// Row `r`'s live columns of the storage `k` / `v`, `[1, H, live, D]`
    /// each: a slice (a view, no copy) when the row has no holes, else its
    /// live columns gathered.
    fn live_row(&self, k: &Array, v: &Array, r: usize) -> Result<(Array, Array)> {
        self.settle()?;
        let (ks, vs) = (k.shape(), v.shape());
        let (pad, end) = (self.left_pad[r] as i32, self.idx as i32);
        let row_k = slice(k, &[r as i32, 0, pad, 0], &[r as i32 + 1, ks[1], end, ks[3]])?;
        let row_v = slice(v, &[r as i32, 0, pad, 0], &[r as i32 + 1, vs[1], end, vs[3]])?;
        self.lend(self.idx);
        if self.holes.count(r) == 0 {
            return Ok((row_k, row_v));
        }
        let live: Vec<i32> = self.holes.live_columns(r, self.left_pad[r], self.idx).iter().map(|c| c - pad).collect();
        Ok((gather_columns(&row_k, std::slice::from_ref(&live))?, gather_columns(&row_v, &[live])?))
    }

    pub(crate) fn extract(&self, row: u32) -> Result<CacheState> {
        let r = row as usize;
        if r >= self.rows() {
            return Err(error(format!("extract_row: row {r} out of range (rows = {})", self.rows())));
        }
        let mut one = self.emptied(1);
        if let (Some(k), Some(v)) = (&self.keys, &self.values) {
            let (keys, values) = self.live_row(k, v, r)?;
            one.idx = keys.shape()[2] as usize;
            one.keys = Some(keys);
            one.values = Some(values);
        }
        one.state()
    }
}

/// A 1-row buffer `[1, H, width, D]` holding `row`'s first `n` columns at
/// `len - n .. len` (zeros elsewhere; all zeros when the row is empty).
fn padded_row(
    row: Option<&Array>,
    n: usize,
    len: usize,
    width: usize,
    heads: i32,
    dim: i32,
    dtype: Dtype,
) -> Result<Array> {
    let Some(a) = row.filter(|_| n > 0) else { return zeros(&[1, heads, width as i32, dim], dtype) };
    let mut parts = Vec::new();
    if len > n {
        parts.push(zeros(&[1, heads, (len - n) as i32, dim], dtype)?);
    }
    parts.push(columns_to(a, n)?);
    parts.push(zeros(&[1, heads, (width - len) as i32, dim], dtype)?);
    mlx_rs::ops::concatenate(&parts, 2)
}
