//! Cache layout `kv-plain`: keys and values for full-attention layers, in
//! the model's dtype, as mlx-lm's `KVCache` (serial) and `BatchKVCache`
//! (rows, left-padded) keep them.
//!
//! Storage `[slots, H, capacity, D]` grows in steps of `spec.step` tokens and
//! is written in place (never concatenated per token): on the GPU by
//! `model_kit::kv_write` where no view the layout lent covers the columns
//! written (`lent_upto`), else with slice updates.
//! Rows of different lengths are left-padded; each row's RoPE position is
//! `write index - left padding`, and masks hide the padding. A batched
//! speculative round whose rows keep different counts leaves per-row holes
//! (`holes.rs`), hidden the same way. Rows occupy the first slots; a row
//! that leaves frees its slot and a joiner takes a free slot in place
//! (`slots.rs`); otherwise joins and leaves copy (`rows.rs`). A state for
//! export and import is `state.rs`; the `CacheLayout` methods, `layout.rs`.
//!
//! Schemes: `plain`, the affine ones (`affine8`, `affine4`) and TurboQuant
//! (`turbo`): the same storage holding each token's codes (`kv_quant::Quantized` around this
//! layout, which moves whole token columns and so implements
//! `kv_quant::Columns`), attended through quantized matmuls as mlx-lm's
//! `QuantizedKVCache` is (TurboQuant's values: weighted in their rotated
//! form, rotated back once per query).

mod holes;
mod layout;
#[cfg(test)]
mod quantized_tests;
mod rows;
mod slots;
mod state;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod write_tests;

use holes::{compact_plan, gather_columns, Holes, COMPACT_AFTER};

use kv_quant::{Columns, Quantized, Scheme, Widths};
use model_kit::kv_write;
use model_kit::ops::{dtype_from_raw, dtype_size, slice, slice_update, zeros};
use model_kit::{error, Array, Dtype, Result};
use plugin_api::abi_stable::sabi_trait::TD_Opaque;
use plugin_api::abi_stable::std_types::{ROption, RSlice, RString, RVec};
use plugin_api::*;
use plugin_sdk::{guard, guard_mlx, into_array, into_tensor, mlx_rs, quietly, rstrings};
use std::cell::Cell;

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
        &[caps::TRIM, caps::SPEC_ROUND, caps::SPEC_PIPELINE, caps::STATE_IO, caps::ROWS, "kv-view:plain"],
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
        marks: Vec::new(),
        lent_upto: Cell::new(0),
        pending: Cell::new(None),
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
    /// `idx` when each open speculative round began, oldest first (rounds
    /// overlap when the host pipelines them: `caps::SPEC_PIPELINE`).
    marks: Vec<usize>,
    /// The storage's columns before this one may be held by views that
    /// outlive a step (exported states, rows, drafters' views; an imported
    /// state's storage: all of it), so `kv_write` never writes them in
    /// place. A `Cell`: lending is a `&self` method.
    lent_upto: Cell<usize>,
    /// The last in-place write's mark while it may be unscheduled
    /// (`settle`).
    pending: Cell<Option<Array>>,
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
        self.settle()?;
        let (rows, pads) = compact_plan(&self.holes, &self.left_pad, self.idx);
        if let (Some(k), Some(v)) = (self.keys.take(), self.values.take()) {
            self.keys = Some(gather_columns(&columns_to(&self.rows_in_use(&k)?, self.idx)?, &rows)?);
            self.values = Some(gather_columns(&columns_to(&self.rows_in_use(&v)?, self.idx)?, &rows)?);
            self.lent_upto.set(0);
        }
        self.idx = rows.first().map_or(0, Vec::len);
        self.base = 0;
        self.left_pad = pads;
        self.holes = Holes::none(self.left_pad.len());
        Ok(())
    }

    /// Stores `k`/`v` and returns the queries to attend with, and whether
    /// the K/V were written in place: by `kv_write`, the queries passed
    /// through the write, where no lent view covers the columns and the
    /// kernel takes them (the storage has room); else by `store`.
    fn store_for(&mut self, q: Array, k: Array, v: Array) -> Result<(Array, Array, Array, bool)> {
        if let (Some(ks), Some(vs), true) = (&self.keys, &self.values, self.idx >= self.lent_upto.get()) {
            let after = self.pending.take();
            let written = kv_write::write((ks, vs), (&k, &v, &q), self.idx, after.as_ref());
            if let Ok(Some(written)) = written {
                self.idx += k.shape()[2] as usize;
                let out = (self.window(ks)?, self.window(vs)?);
                self.pending.set(Some(written.done));
                return Ok((written.queries, out.0, out.1, true));
            }
            self.pending.set(after);
            written?;
        }
        let (k, v) = self.store(k, v)?;
        Ok((q, k, v, false))
    }

    /// Schedules the last in-place write (`kv_write`) if it is not yet:
    /// MLX cannot see that it writes the storage, so an op that reads the
    /// storage other than through its queries must land in a later launch.
    /// Every other reader of the storage calls this first.
    fn settle(&self) -> Result<()> {
        match self.pending.take() {
            Some(done) => mlx_rs::transforms::async_eval([&done]),
            None => Ok(()),
        }
    }

    fn store(&mut self, k: Array, v: Array) -> Result<(Array, Array)> {
        self.settle()?;
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
        // MLX copies the storage when anything else holds it, so what the
        // slice update returns is held by no lent view.
        self.lent_upto.set(0);
        let out = (self.window(&ks)?, self.window(&vs)?);
        self.keys = Some(ks);
        self.values = Some(vs);
        Ok(out)
    }

    /// Marks the storage's first `end` columns as held by a view that may
    /// outlive the step.
    fn lend(&self, end: usize) {
        self.lent_upto.set(self.lent_upto.get().max(end));
    }

    /// Column numbers after the storage dropped the columns before `base`.
    fn rebase(&mut self) {
        let b = self.base;
        self.idx -= b;
        self.left_pad.iter_mut().for_each(|p| *p -= b);
        self.holes.shift_left(b);
        self.marks.iter_mut().for_each(|m| *m = m.saturating_sub(b));
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

    /// A cache of this geometry holding nothing, with `rows` rows.
    fn emptied(&self, rows: usize) -> Self {
        PlainKv {
            keys: None,
            values: None,
            idx: 0,
            base: 0,
            left_pad: vec![0; rows],
            holes: Holes::none(rows),
            marks: Vec::new(),
            lent_upto: Cell::new(0),
            pending: Cell::new(None),
            ..*self.geometry()
        }
    }

    fn geometry(&self) -> &Self {
        self
    }
}

impl Columns for PlainKv {
    fn blank(&self, w: Widths, one_row: bool) -> Self {
        let rows = if one_row { 1 } else { self.rows() };
        PlainKv { k_dim: w.k, v_dim: w.v, dtype: w.dtype, ..self.emptied(rows) }
    }

    fn recode(
        &mut self,
        w: Widths,
        keys: &dyn Fn(&Array) -> Result<Array>,
        values: &dyn Fn(&Array) -> Result<Array>,
    ) -> Result<()> {
        self.settle()?;
        self.keys = self.keys.as_ref().map(keys).transpose()?;
        self.values = self.values.as_ref().map(values).transpose()?;
        (self.k_dim, self.v_dim, self.dtype) = (w.k, w.v, w.dtype);
        self.lent_upto.set(usize::MAX);
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
