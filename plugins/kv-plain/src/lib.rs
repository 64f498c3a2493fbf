//! Cache layout `kv-plain`: keys and values for full-attention layers, in
//! the model's dtype, as mlx-lm's `KVCache` (serial) and `BatchKVCache`
//! (rows, left-padded) keep them.
//!
//! Storage `[slots, H, capacity, D]` grows in steps of `spec.step` tokens and
//! is written in place with slice updates (never concatenated per token).
//! Rows of different lengths are left-padded; each row's RoPE position is
//! `write index - left padding`, and masks hide the padding. A batched
//! speculative round whose rows keep different counts leaves per-row holes
//! (`holes.rs`), hidden the same way. Rows occupy the first slots; a row
//! that leaves frees its slot and a joiner takes a free slot in place
//! (`slots.rs`).
//!
//! Schemes: `plain`, the affine ones (`affine8`, `affine4`) and TurboQuant
//! (`turbo`): the same storage holding each token's codes (`kv_quant::Quantized` around this
//! layout, which moves whole token columns and so implements
//! `kv_quant::Columns`), attended through quantized matmuls as mlx-lm's
//! `QuantizedKVCache` is (TurboQuant's values: weighted in their rotated
//! form, rotated back once per query).

mod holes;
#[cfg(test)]
mod quantized_tests;
mod slots;
#[cfg(test)]
mod tests;

use holes::{compact_plan, gather_columns, Holes, COMPACT_AFTER};

use kv_quant::{Columns, Quantized, Scheme, Widths};
use model_kit::ops::{dtype_from_raw, dtype_size, slice, slice_update, zeros};
use model_kit::{error, Array, Dtype, Result};
use plugin_api::abi_stable::sabi_trait::TD_Opaque;
use plugin_api::abi_stable::std_types::{ROption, RSlice, RString, RVec};
use plugin_api::*;
use plugin_sdk::{guard, guard_mlx, into_array, into_tensor, mlx_rs, quietly, rstrings};

plugin_sdk::export_plugin! {
    manifest: manifest,
    new_cache: new_cache,
}

fn manifest() -> PluginManifest {
    plugin_sdk::manifest!(
        PluginKind::CACHE_LAYOUT,
        "K/V for full attention, in the model dtype or as affine or TurboQuant codes, grown in steps, written in place",
        Claims {
            cache_needs: rstrings(&["full"]),
            cache_schemes: rstrings(&["plain", Scheme::AFFINE[0], Scheme::AFFINE[1], Scheme::TURBO]),
            ..Default::default()
        },
        &[caps::TRIM, caps::SPEC_ROUND, caps::STATE_IO, caps::ROWS, "kv-view:plain"],
    )
}

fn new_cache(spec: &CacheSpec) -> std::result::Result<CacheBox, PluginError> {
    if spec.need.kind != NeedKind::FULL {
        return Err(PluginError::unsupported(format!(
            "kv-plain serves full attention, not `{}`",
            spec.need.kind.as_str()
        )));
    }
    let scheme = Scheme::parse(spec.scheme.as_str()).map_err(|e| PluginError::unsupported(format!("kv-plain: {e}")))?;
    let dtype = dtype_from_raw(spec.dtype.0).map_err(|e| PluginError::invalid_input(e.what()))?;
    let kv = PlainKv {
        keys: None,
        values: None,
        idx: 0,
        base: 0,
        left_pad: vec![0; spec.rows as usize],
        holes: Holes::none(spec.rows as usize),
        step: spec.step.max(1) as usize,
        heads: spec.need.kv_heads as i32,
        k_dim: spec.need.k_head_dim as i32,
        v_dim: spec.need.v_head_dim as i32,
        dtype,
        mark: None,
    };
    match scheme {
        None => Ok(CacheLayout_TO::from_value(kv, TD_Opaque)),
        Some(scheme) => {
            let plain = Widths { k: kv.k_dim, v: kv.v_dim, dtype };
            let q =
                Quantized::new(kv, scheme, plain).map_err(|e| PluginError::invalid_input(format!("kv-plain: {e}")))?;
            Ok(CacheLayout_TO::from_value(q, TD_Opaque))
        }
    }
}

struct PlainKv {
    keys: Option<Array>,
    values: Option<Array>,
    /// Columns written (the same for every row; shorter rows are left-padded).
    idx: usize,
    /// The first storage column attention reads: columns before it are
    /// padding in every row (left behind by rows that left), skipped
    /// without a copy until the storage is next rebuilt.
    base: usize,
    left_pad: Vec<usize>,
    holes: Holes,
    step: usize,
    heads: i32,
    k_dim: i32,
    v_dim: i32,
    dtype: Dtype,
    /// `idx` when the current speculative round began.
    mark: Option<usize>,
}

impl PlainKv {
    fn rows(&self) -> usize {
        self.left_pad.len()
    }

    /// Whether some row has columns that others do not (padding, holes):
    /// then positions are per row and masks explicit.
    fn padded(&self) -> bool {
        self.left_pad.iter().any(|&p| p > self.base) || self.holes.any()
    }

    /// Tokens in the attended window (every row's RoPE position when no
    /// row is padded).
    fn len(&self) -> usize {
        self.idx - self.base
    }

    /// The attended window of storage `a`: rows in use, columns `base..idx`
    /// (a view; `a` itself when that is all of it).
    fn window(&self, a: &Array) -> Result<Array> {
        let s = a.shape();
        if s[0] as usize == self.rows() && self.base == 0 && s[2] as usize == self.idx {
            return Ok(a.clone());
        }
        slice(a, &[0, 0, self.base as i32, 0], &[self.rows() as i32, s[1], self.idx as i32, s[3]])
    }

    /// Storage `a`'s rows in use, every column (a view; `a` itself when
    /// no slot is free).
    fn rows_in_use(&self, a: &Array) -> Result<Array> {
        let s = a.shape();
        if s[0] as usize == self.rows() {
            return Ok(a.clone());
        }
        slice(a, &[0, 0, 0, 0], &[self.rows() as i32, s[1], s[2], s[3]])
    }

    /// Row r's live tokens (its RoPE position for the next token).
    fn row_len(&self, r: usize) -> usize {
        self.idx - self.left_pad[r] - self.holes.count(r)
    }

    /// Squeezes holes (and padding beyond what rows need) out of storage.
    fn compact(&mut self) -> Result<()> {
        let (rows, pads) = compact_plan(&self.holes, &self.left_pad, self.idx);
        if let (Some(k), Some(v)) = (self.keys.take(), self.values.take()) {
            self.keys = Some(gather_columns(&columns_to(&self.rows_in_use(&k)?, self.idx)?, &rows)?);
            self.values = Some(gather_columns(&columns_to(&self.rows_in_use(&v)?, self.idx)?, &rows)?);
        }
        self.idx = rows.first().map_or(0, Vec::len);
        self.base = 0;
        self.left_pad = pads;
        self.holes = Holes::none(self.left_pad.len());
        Ok(())
    }

    fn store(&mut self, k: Array, v: Array) -> Result<(Array, Array)> {
        let (b, l) = (k.shape()[0], k.shape()[2] as usize);
        let cap = self.keys.as_ref().map_or(0, |a| a.shape()[2] as usize);
        if self.keys.is_none() || self.idx + l > cap {
            let n_steps = (self.step + l - 1) / self.step;
            let grow = (n_steps * self.step) as i32;
            let nk = zeros(&[b, self.heads, grow, self.k_dim], k.dtype())?;
            let nv = zeros(&[b, self.heads, grow, self.v_dim], v.dtype())?;
            match (self.keys.take(), self.values.take()) {
                (Some(ok), Some(ov)) => {
                    // The new storage holds the attended window only: free
                    // slots and the columns before `base` are left behind.
                    let (ok, ov) = (self.window(&ok)?, self.window(&ov)?);
                    self.keys = Some(mlx_rs::ops::concatenate(&[ok, nk], 2)?);
                    self.values = Some(mlx_rs::ops::concatenate(&[ov, nv], 2)?);
                    self.rebase();
                }
                _ => {
                    self.keys = Some(nk);
                    self.values = Some(nv);
                }
            }
        }
        let prev = self.idx;
        self.idx = prev + l;
        let (ks, vs) = (self.keys.take().unwrap(), self.values.take().unwrap());
        let end = self.idx as i32;
        let ks = slice_update(&ks, &k, &[0, 0, prev as i32, 0], &[b, self.heads, end, self.k_dim])?;
        let vs = slice_update(&vs, &v, &[0, 0, prev as i32, 0], &[b, self.heads, end, self.v_dim])?;
        let out = (self.window(&ks)?, self.window(&vs)?);
        self.keys = Some(ks);
        self.values = Some(vs);
        Ok(out)
    }

    /// Column numbers after the storage dropped the columns before `base`.
    fn rebase(&mut self) {
        let b = self.base;
        self.idx -= b;
        self.left_pad.iter_mut().for_each(|p| *p -= b);
        self.holes.shift_left(b);
        self.mark = self.mark.map(|m| m.saturating_sub(b));
        self.base = 0;
    }

    /// mlx-lm's `create_causal_mask` with left padding over the attended
    /// window: `[B, 1, n, idx + n - base]`.
    fn mask_array(&self, n: usize) -> Result<Array> {
        let total = (self.idx + n) as i32;
        let cols = Array::arange::<_, i32>(self.base as i32, total, 1)?;
        let rows = Array::arange::<_, i32>(self.idx as i32, total, 1)?.reshape(&[n as i32, 1])?;
        let causal = rows.ge(&cols)?;
        let pads: Vec<i32> = self.left_pad.iter().map(|&p| p as i32).collect();
        let pads = Array::from_slice(&pads, &[self.rows() as i32, 1, 1, 1]);
        let mask = causal.logical_and(cols.ge(&pads)?)?;
        if self.holes.any() {
            let live = self.holes.live_mask(total as usize);
            let live = slice(&live, &[0, 0, 0, self.base as i32], &[self.rows() as i32, 1, 1, total])?;
            return mask.logical_and(live);
        }
        Ok(mask)
    }

    fn state(&self) -> Result<CacheState> {
        if self.holes.any() {
            let mut compact = self.clone();
            compact.compact()?;
            return compact.state();
        }
        let mut tensors = RVec::new();
        if let (Some(k), Some(v)) = (&self.keys, &self.values) {
            tensors.push(into_tensor(self.window(k)?));
            tensors.push(into_tensor(self.window(v)?));
        }
        let mut meta: RVec<u64> = RVec::new();
        meta.push(self.len() as u64);
        meta.extend(self.left_pad.iter().map(|&p| (p - self.base) as u64));
        Ok(CacheState { signature: self.signature(), offset: self.len() as u64, tensors, meta })
    }

    fn load(&mut self, state: CacheState) -> Result<()> {
        if state.signature != self.signature() {
            return Err(error(format!(
                "state of `{}` cannot be imported into `{}`",
                state.signature,
                self.signature()
            )));
        }
        let meta: Vec<usize> = state.meta.iter().map(|&m| m as usize).collect();
        let mut t = state.tensors.into_iter();
        match (t.next(), t.next()) {
            (Some(k), Some(v)) => {
                let (k, v) = (into_array(k), into_array(v));
                let rows = k.shape()[0] as usize;
                if meta.len() != 1 + rows || meta[0] != k.shape()[2] as usize {
                    return Err(error("kv-plain state: metadata does not match its tensors"));
                }
                self.keys = Some(k);
                self.values = Some(v);
                self.idx = meta[0];
                self.base = 0;
                self.left_pad = meta[1..].to_vec();
                self.holes = Holes::none(rows);
            }
            _ => {
                self.keys = None;
                self.values = None;
                self.idx = 0;
                self.base = 0;
                self.left_pad = vec![0; meta.len().saturating_sub(1).max(1)];
                self.holes = Holes::none(self.left_pad.len());
            }
        }
        self.mark = None;
        Ok(())
    }

    fn signature(&self) -> RString {
        format!("kv:plain:{:?}:h{}:k{}:v{}", self.dtype, self.heads, self.k_dim, self.v_dim).to_lowercase().into()
    }

    /// Appends 1-row states, left-padding everyone to a common length: into
    /// free slots in place when they fit (`slots.rs`), else in one copy of
    /// the batch that keeps room for the next tokens (rows concatenated to
    /// exactly the merged length would make the next update regrow the
    /// buffer, a second copy of the whole batch at every join). Columns that
    /// are padding in every row are left out of a copy.
    fn merge(&mut self, rows: Vec<CacheState>) -> Result<()> {
        let mut new_rows = Vec::new();
        for st in rows {
            let mut one = PlainKv {
                keys: None,
                values: None,
                idx: 0,
                base: 0,
                left_pad: vec![0],
                holes: Holes::none(1),
                mark: None,
                ..*self.geometry()
            };
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
        self.idx = len;
        self.base = 0;
        self.left_pad = pads;
        self.holes = holes;
        Ok(())
    }

    fn geometry(&self) -> &Self {
        self
    }

    /// Keeps rows `keep`, in that order: by moving the rows whose slot
    /// changes, keeping the freed slots (`slots.rs`), else in one copy that leaves out the
    /// columns that are padding in every kept row and keeps the spare
    /// capacity, so the next update writes in place.
    fn filter(&mut self, keep: &[u32]) -> Result<()> {
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
        }
        self.idx -= common;
        self.base = 0;
        self.left_pad.iter_mut().for_each(|p| *p -= common);
        self.holes.shift_left(common);
        Ok(())
    }

    /// Row r's live columns, from position 0: a slice of the storage, or a
    /// gather where the row has holes.
    fn view(&self, row: u32) -> Result<KvView> {
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
        let (ks, vs) = (k.shape(), v.shape());
        let (pad, end) = (self.left_pad[r] as i32, self.idx as i32);
        let row_k = slice(k, &[r as i32, 0, pad, 0], &[r as i32 + 1, ks[1], end, ks[3]])?;
        let row_v = slice(v, &[r as i32, 0, pad, 0], &[r as i32 + 1, vs[1], end, vs[3]])?;
        let (keys, values) = if self.holes.count(r) == 0 {
            (row_k, row_v)
        } else {
            let live: Vec<i32> =
                self.holes.live_columns(r, self.left_pad[r], self.idx).iter().map(|c| c - pad).collect();
            (gather_columns(&row_k, std::slice::from_ref(&live))?, gather_columns(&row_v, &[live])?)
        };
        Ok(KvView { keys: into_tensor(keys), values: into_tensor(values), first: 0 })
    }

    fn extract(&self, row: u32) -> Result<CacheState> {
        let r = row as usize;
        if r >= self.rows() {
            return Err(error(format!("extract_row: row {r} out of range (rows = {})", self.rows())));
        }
        let mut one = PlainKv {
            keys: None,
            values: None,
            idx: 0,
            base: 0,
            left_pad: vec![0],
            holes: Holes::none(1),
            mark: None,
            ..*self.geometry()
        };
        if let (Some(k), Some(v)) = (&self.keys, &self.values) {
            let (ks, vs) = (k.shape(), v.shape());
            let row_k = slice(k, &[r as i32, 0, 0, 0], &[r as i32 + 1, ks[1], self.idx as i32, ks[3]])?;
            let row_v = slice(v, &[r as i32, 0, 0, 0], &[r as i32 + 1, vs[1], self.idx as i32, vs[3]])?;
            let live = vec![self.holes.live_columns(r, self.left_pad[r], self.idx)];
            one.idx = live[0].len();
            one.keys = Some(gather_columns(&row_k, &live)?);
            one.values = Some(gather_columns(&row_v, &live)?);
        }
        one.state()
    }
}

impl Columns for PlainKv {
    fn blank(&self, w: Widths, one_row: bool) -> Self {
        let rows = if one_row { 1 } else { self.rows() };
        PlainKv {
            keys: None,
            values: None,
            idx: 0,
            base: 0,
            left_pad: vec![0; rows],
            holes: Holes::none(rows),
            mark: None,
            k_dim: w.k,
            v_dim: w.v,
            dtype: w.dtype,
            ..*self.geometry()
        }
    }

    fn recode(
        &mut self,
        w: Widths,
        keys: &dyn Fn(&Array) -> Result<Array>,
        values: &dyn Fn(&Array) -> Result<Array>,
    ) -> Result<()> {
        self.keys = self.keys.as_ref().map(keys).transpose()?;
        self.values = self.values.as_ref().map(values).transpose()?;
        (self.k_dim, self.v_dim, self.dtype) = (w.k, w.v, w.dtype);
        Ok(())
    }
}

/// Storage `a`'s first `c` columns (a view; `a` itself when that is all).
fn columns_to(a: &Array, c: usize) -> Result<Array> {
    let s = a.shape();
    if s[2] as usize == c {
        return Ok(a.clone());
    }
    slice(a, &[0, 0, 0, 0], &[s[0], s[1], c as i32, s[3]])
}

/// Storage `a` from column `c` to the end of its capacity (a view).
fn columns_from(a: &Array, c: usize) -> Result<Array> {
    if c == 0 {
        return Ok(a.clone());
    }
    let s = a.shape();
    slice(a, &[0, 0, c as i32, 0], &[s[0], s[1], s[2], s[3]])
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

impl Clone for PlainKv {
    fn clone(&self) -> Self {
        Self {
            keys: self.keys.clone(),
            values: self.values.clone(),
            idx: self.idx,
            base: self.base,
            left_pad: self.left_pad.clone(),
            holes: self.holes.clone(),
            step: self.step,
            heads: self.heads,
            k_dim: self.k_dim,
            v_dim: self.v_dim,
            dtype: self.dtype,
            mark: self.mark,
        }
    }
}

impl CacheLayout for PlainKv {
    fn signature(&self) -> RString {
        quietly(RString::new(), || PlainKv::signature(self))
    }

    fn offset(&self) -> u64 {
        self.len() as u64
    }

    fn positions(&self) -> PResult<Positions> {
        guard_mlx(|| {
            let per_row = if self.padded() {
                let offs: Vec<i32> = (0..self.rows()).map(|r| self.row_len(r) as i32).collect();
                ROption::RSome(into_tensor(Array::from_slice(&offs, &[offs.len() as i32])))
            } else {
                ROption::RNone
            };
            Ok(Positions { offset: self.len() as u64, per_row })
        })
    }

    fn attention_mask(&self, queries: u32) -> PResult<AttentionMask> {
        guard_mlx(|| {
            Ok(if self.padded() {
                AttentionMask {
                    mode: MaskMode::ARRAY,
                    array: ROption::RSome(into_tensor(self.mask_array(queries as usize)?)),
                }
            } else if queries <= 1 {
                AttentionMask { mode: MaskMode::NONE, array: ROption::RNone }
            } else {
                AttentionMask { mode: MaskMode::CAUSAL, array: ROption::RNone }
            })
        })
    }

    fn update_and_fetch(&mut self, keys: Tensor, values: Tensor) -> PResult<KvPair> {
        guard_mlx(|| {
            let (k, v) = (into_array(keys), into_array(values));
            if k.ndim() != 4 || k.shape()[1] != self.heads || k.shape()[3] != self.k_dim || v.shape()[3] != self.v_dim {
                return Err(error(format!(
                    "kv-plain: keys {:?} / values {:?} do not match the declared need",
                    k.shape(),
                    v.shape()
                )));
            }
            if k.shape()[0] as usize != self.rows() {
                return Err(error(format!("kv-plain: {} rows given, cache holds {}", k.shape()[0], self.rows())));
            }
            let (k, v) = self.store(k, v)?;
            Ok(KvPair { keys: into_tensor(k), values: into_tensor(v) })
        })
    }

    fn is_trimmable(&self) -> bool {
        true
    }

    fn trim(&mut self, n: u64) -> u64 {
        quietly(0, || {
            // Left padding never trims below a row's own start.
            let floor = self.left_pad.iter().copied().max().unwrap_or(0);
            let n = (n as usize).min(self.idx.saturating_sub(floor));
            self.idx -= n;
            self.holes.cut(self.idx);
            n as u64
        })
    }

    fn bytes_per_token(&self) -> u64 {
        (self.rows().max(1) * self.heads as usize * (self.k_dim + self.v_dim) as usize * dtype_size(self.dtype)) as u64
    }

    fn export_state(&self) -> PResult<CacheState> {
        guard_mlx(|| self.state())
    }

    fn import_state(&mut self, state: CacheState) -> PResult<()> {
        guard_mlx(|| self.load(state))
    }

    fn spec_begin(&mut self) -> PResult<()> {
        self.mark = Some(self.idx);
        PResult::ROk(())
    }

    fn spec_commit(&mut self) -> PResult<()> {
        self.mark = None;
        PResult::ROk(())
    }

    fn spec_rollback(&mut self, keep: RSlice<'_, u64>) -> PResult<()> {
        guard(|| {
            let mark =
                self.mark.take().ok_or_else(|| PluginError::invalid_input("spec_rollback without spec_begin"))?;
            if keep.is_empty() || (keep.len() != 1 && keep.len() != self.rows()) {
                return Err(PluginError::invalid_input(format!(
                    "spec_rollback: {} keep counts for {} rows",
                    keep.len(),
                    self.rows()
                )));
            }
            let appended = self.idx - mark;
            let keep_of = |r: usize| (keep[if keep.len() == 1 { 0 } else { r }] as usize).min(appended);
            let most = (0..self.rows().max(1)).map(keep_of).max().unwrap_or(0);
            self.idx = mark + most;
            // Rows that kept fewer than the most-keeping row: the rest of
            // their round is dead columns, masked from now on.
            for r in 0..self.rows() {
                self.holes.add(r, mark + keep_of(r), mark + most);
            }
            if self.holes.max_count() > COMPACT_AFTER {
                self.compact().map_err(|e| PluginError::mlx(e.what()))?;
            }
            Ok(())
        })
    }

    fn rows(&self) -> u32 {
        quietly(0, || PlainKv::rows(self) as u32)
    }

    fn filter_rows(&mut self, keep: RSlice<'_, u32>) -> PResult<()> {
        guard_mlx(|| self.filter(keep.as_slice()))
    }

    fn extract_row(&self, row: u32) -> PResult<CacheState> {
        guard_mlx(|| self.extract(row))
    }

    fn merge_rows(&mut self, rows: RVec<CacheState>) -> PResult<()> {
        guard_mlx(|| self.merge(rows.into_vec()))
    }

    fn get_slot(&self, _i: u32) -> PResult<ROption<Tensor>> {
        PResult::RErr(PluginError::unsupported("kv-plain has no recurrent slots"))
    }

    fn set_slot(&mut self, _i: u32, _value: Tensor) -> PResult<()> {
        PResult::RErr(PluginError::unsupported("kv-plain has no recurrent slots"))
    }

    fn kv_view(&self, row: u32) -> PResult<KvView> {
        guard_mlx(|| self.view(row))
    }

    fn begin_padded(&mut self, pads: RSlice<'_, u32>) -> PResult<()> {
        guard(|| {
            if self.idx > 0 {
                return Err(PluginError::invalid_input("kv-plain: begin_padded on a cache that holds tokens"));
            }
            // The padding columns are written by the next update (whatever the
            // model computes for them) and hidden by the mask from then on.
            self.keys = None;
            self.values = None;
            self.base = 0;
            self.left_pad = pads.iter().map(|&p| p as usize).collect();
            self.holes = Holes::none(pads.len());
            Ok(())
        })
    }
}
