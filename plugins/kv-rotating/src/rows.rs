//! Row operations of the ring, as mlx-lm's `BatchRotatingKVCache` does
//! them: `merge` (1-row states, each put in temporal order and cut to its
//! last `min(offset, max_size)` tokens, left-padded to the longest),
//! `extend` (appends such a batch to the running one, aligning write
//! indices), `filter`, `extract` (a compact 1-row state in temporal order)
//! and `prepare(left_padding=...)` for a cohort prefill.

use crate::columns::{blank, cols, len, pad_cols, roll, row_of};
use crate::geometry::Geometry;
use crate::ring::Ring;
use model_kit::{error, Array, Result};
use plugin_api::{CacheState, ErrorCode, KvView, PluginError};
use plugin_sdk::{into_tensor, mlx_error, mlx_rs};

/// mlx-lm `BatchRotatingKVCache.merge`: a new batch of 1-row states.
pub fn merged(geo: Geometry, states: Vec<CacheState>) -> std::result::Result<Ring, PluginError> {
    let mut ones: Vec<Ring> = Vec::with_capacity(states.len());
    for st in states {
        ones.push(Ring::from_serial_state(geo, st)?);
    }
    let build = move || -> Result<Ring> {
        let mut out = Ring::empty(geo, ones.len());
        out.offsets = ones.iter().map(|c| c.max_offset() as i64).collect();
        let sizes: Vec<usize> = out.offsets.iter().map(|&o| (o as usize).min(geo.max_size)).collect();
        let longest = sizes.iter().copied().max().unwrap_or(0);
        if longest == 0 {
            return Ok(out);
        }
        let (mut ks, mut vs, mut pads) = (Vec::new(), Vec::new(), Vec::new());
        let like = ones.iter().find_map(|c| c.keys.clone()).expect("a row with tokens");
        for (mut c, &size) in ones.into_iter().zip(&sizes) {
            let pad = longest - size;
            // The row's last `size` tokens, oldest first.
            c.linear()?;
            match (&c.keys, &c.values) {
                (Some(k), Some(v)) => {
                    ks.push(pad_cols(cols(k, len(k) - size, len(k))?, pad, 0)?);
                    vs.push(pad_cols(cols(v, len(v) - size, len(v))?, pad, 0)?);
                }
                _ => {
                    ks.push(blank(&like, 1, longest, geo.k_dim)?);
                    vs.push(blank(&like, 1, longest, geo.v_dim)?);
                }
            }
            pads.push(pad);
        }
        out.left_pad = pads;
        out.keys = Some(mlx_rs::ops::concatenate(&ks, 0)?);
        out.values = Some(mlx_rs::ops::concatenate(&vs, 0)?);
        out.idx = longest;
        out.seen = longest;
        Ok(out)
    };
    build().map_err(mlx_error)
}

impl Ring {
    /// mlx-lm `extend`: `other`'s rows after these, write indices aligned
    /// (the rows with fewer written columns are left-padded).
    fn extend(&mut self, mut other: Ring) -> Result<()> {
        if self.rows() == 0 {
            *self = other;
            return Ok(());
        }
        if self.keys.is_none() && other.keys.is_none() {
            self.left_pad.extend(other.left_pad);
            self.offsets.extend(other.offsets);
            return Ok(());
        }
        if self.rotated != other.rotated || self.idx != other.idx {
            self.temporal_order()?;
            other.temporal_order()?;
        }
        let idx = self.idx.max(other.idx);
        let storage = |c: &Ring| c.keys.as_ref().map_or(0, len);
        let width = storage(self).max(storage(&other));
        let like = self.keys.clone().or_else(|| other.keys.clone()).expect("a side with storage");
        let (k_dim, v_dim) = (self.geo.k_dim, self.geo.v_dim);
        let aligned = |c: &mut Ring| -> Result<(Array, Array)> {
            let rows = c.rows() as i32;
            let k = c.keys.take().map_or_else(|| blank(&like, rows, 0, k_dim), Ok)?;
            let v = c.values.take().map_or_else(|| blank(&like, rows, 0, v_dim), Ok)?;
            let left = idx - c.idx;
            // Past `width`, a side's columns are unwritten growth: cut them.
            let keep = len(&k).min(width - left);
            let right = width - left - keep;
            c.left_pad.iter_mut().for_each(|p| *p += left);
            Ok((pad_cols(cols(&k, 0, keep)?, left, right)?, pad_cols(cols(&v, 0, keep)?, left, right)?))
        };
        let (k1, v1) = aligned(self)?;
        let (k2, v2) = aligned(&mut other)?;
        self.keys = Some(mlx_rs::ops::concatenate(&[k1, k2], 0)?);
        self.values = Some(mlx_rs::ops::concatenate(&[v1, v2], 0)?);
        self.left_pad.extend(other.left_pad);
        self.offsets.extend(other.offsets);
        self.idx = idx;
        self.seen = self.seen.max(other.seen);
        Ok(())
    }

    /// Appends rows given as 1-row states (`CacheLayout::merge_rows`).
    pub fn merge(&mut self, states: Vec<CacheState>) -> std::result::Result<(), PluginError> {
        let other = merged(self.geo, states)?;
        self.extend(other).map_err(mlx_error)
    }

    /// mlx-lm `filter`: keeps the listed rows, in that order.
    pub fn filter(&mut self, keep: &[u32]) -> Result<()> {
        if let Some(bad) = keep.iter().find(|&&r| r as usize >= self.rows()) {
            return Err(error(format!("filter_rows: row {bad} out of range (rows = {})", self.rows())));
        }
        let idx: Vec<i32> = keep.iter().map(|&r| r as i32).collect();
        let sel = Array::from_slice(&idx, &[idx.len() as i32]);
        if let (Some(k), Some(v)) = (self.keys.take(), self.values.take()) {
            self.keys = Some(k.take_axis(&sel, 0)?);
            self.values = Some(v.take_axis(&sel, 0)?);
        }
        self.left_pad = keep.iter().map(|&r| self.left_pad[r as usize]).collect();
        self.offsets = keep.iter().map(|&r| self.offsets[r as usize]).collect();
        Ok(())
    }

    /// Row `r`'s stored columns in temporal order, without its padding:
    /// slices of the storage (a roll first when the ring has wrapped).
    pub fn row_columns(&self, r: usize) -> Result<Option<(Array, Array)>> {
        let (Some(k), Some(v)) = (&self.keys, &self.values) else { return Ok(None) };
        let (mut k, mut v) = (row_of(k, r)?, row_of(v, r)?);
        let mut end = self.idx;
        if self.rotated {
            k = roll(&k, -(self.idx as isize))?;
            v = roll(&v, -(self.idx as isize))?;
            end = self.geo.max_size;
        }
        let start = self.left_pad[r].min(end);
        if start == end {
            return Ok(None);
        }
        Ok(Some((cols(&k, start, end)?, cols(&v, start, end)?)))
    }

    /// Row `r`'s K/V for a drafter (`CacheLayout::kv_view`): its columns,
    /// the last of them at its newest position.
    pub fn view(&self, r: usize) -> std::result::Result<KvView, PluginError> {
        if r >= self.rows() {
            return Err(PluginError::invalid_input(format!("kv_view: row {r} out of range (rows = {})", self.rows())));
        }
        let none = || -> Result<(Array, Array)> {
            let g = &self.geo;
            Ok((blank_of(g.heads, g.k_dim, g.dtype)?, blank_of(g.heads, g.v_dim, g.dtype)?))
        };
        let (k, v) = match self.row_columns(r).map_err(mlx_error)? {
            Some(kv) => kv,
            None => none().map_err(mlx_error)?,
        };
        let first = (self.offsets[r].max(0) as u64).saturating_sub(len(&k) as u64);
        Ok(KvView { keys: into_tensor(k), values: into_tensor(v), first })
    }

    /// mlx-lm `extract`: row `r` as a serial state, in temporal order,
    /// without its padding (copied, so it does not hold the batch storage).
    pub fn extract(&self, r: usize) -> std::result::Result<CacheState, PluginError> {
        if r >= self.rows() {
            return Err(PluginError::invalid_input(format!(
                "extract_row: row {r} out of range (rows = {})",
                self.rows()
            )));
        }
        let mut one = Ring::empty(self.geo, 1);
        let row = || -> Result<Option<(Array, Array)>> {
            let Some((k, v)) = self.row_columns(r)? else { return Ok(None) };
            Ok(Some((k.contiguous()?, v.contiguous()?)))
        };
        if let Some((k, v)) = row().map_err(mlx_error)? {
            one.idx = len(&k);
            one.keys = Some(k);
            one.values = Some(v);
        }
        let offset = self.offsets[r].max(0);
        if one.keys.is_none() && offset > 0 {
            return Err(PluginError::new(
                ErrorCode::INTERNAL,
                format!("extract_row: row {r} has {offset} tokens but no stored columns"),
            ));
        }
        one.offsets = vec![offset];
        one.seen = offset as usize;
        Ok(one.serial_state())
    }

    /// mlx-lm `prepare(left_padding=pads)`: an empty cache's rows, each
    /// starting with `pads[r]` padding tokens in its next update.
    pub fn begin_padded(&mut self, pads: &[u32]) -> std::result::Result<(), PluginError> {
        if self.keys.is_some() || self.seen > 0 {
            return Err(PluginError::invalid_input("kv-rotating: begin_padded on a cache that holds tokens"));
        }
        if self.rows() != 0 && self.rows() != pads.len() {
            return Err(PluginError::invalid_input(format!(
                "kv-rotating: {} pads for {} rows",
                pads.len(),
                self.rows()
            )));
        }
        if self.rows() == 0 {
            *self = Ring::empty(self.geo, pads.len());
        }
        for (r, &p) in pads.iter().enumerate() {
            self.left_pad[r] += p as usize;
            self.offsets[r] -= p as i64;
        }
        Ok(())
    }
}

/// `[1, heads, 0, dim]`: the view of a row that holds no tokens yet.
fn blank_of(heads: i32, dim: i32, dtype: model_kit::Dtype) -> Result<Array> {
    mlx_rs::ops::zeros_dtype(&[1, heads, 0, dim], dtype)
}
