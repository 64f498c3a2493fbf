//! The ring: keys and values of one or more rows in `max_size` slots,
//! updated exactly as mlx-lm's `BatchRotatingKVCache` updates them (mlx-lm
//! 0.32.2, `mlx_lm/models/cache.py`, `keep = 0` as its `make_cache` builds
//! sliding layers). With one row and no padding these updates are, op for
//! op, those of the serial `RotatingKVCache`, so a serial cache is this
//! ring with one row.
//!
//! All rows share the storage `[B, H, n, D]`, the write index (`_idx`), the
//! timeline (`seen`) and whether the ring has rotated; rows differ by their
//! left padding (columns before their first token, in temporal order) and
//! their offsets (tokens seen: RoPE positions).
//! - One token at a time (`_update_in_place`): the storage grows in steps
//!   of `step` up to `max_size`, then the write index wraps to 0 and
//!   overwrites the oldest slot. Attention reads the ring in storage order
//!   (softmax does not care about order, but bitwise parity does).
//! - Several tokens at once (`_update_concat`): the ring is put in temporal
//!   order, cut to its last `max_size - 1` columns, and the new tokens are
//!   appended (the storage may exceed `max_size` until the next single token).
//!
//! Every eviction or overwrite eats a column of each row's padding first.
//!
//! One deliberate difference: mlx-lm keeps left padding as signed integers
//! that go negative once a row's padding is used up, and `extend` adds new
//! padding to that negative count (hiding too few columns). Here the padding
//! stops at 0, so it always counts the columns to hide.

use crate::columns::{cat, cols, grown, len, roll};
use crate::geometry::Geometry;
use model_kit::ops::slice_update;
use model_kit::{error, Array, Result};

/// MLX arrays are immutable: a clone (handles) is a snapshot.
#[derive(Clone)]
pub(crate) struct Ring {
    pub geo: Geometry,
    /// Storage `[B, H, n, D]`: n <= max_size after single-token steps, up
    /// to `max_size - 1 + L` after a step of L tokens.
    pub keys: Option<Array>,
    pub values: Option<Array>,
    /// Per row: padding columns at the front (mlx-lm `left_padding`).
    pub left_pad: Vec<usize>,
    /// Per row: tokens seen (mlx-lm `offset`); negative while a row's
    /// padding of a cohort prefill has not been written yet.
    pub offsets: Vec<i64>,
    /// Next write slot (mlx-lm `_idx`).
    pub idx: usize,
    /// Columns the storage timeline has advanced (the batched class's
    /// `_offset`, the serial class's `offset`): the longest row's tokens,
    /// at most the ring's when rows merge, plus later steps.
    pub seen: usize,
    /// Whether single-token steps wrapped the write index (storage order is
    /// then not temporal order).
    pub rotated: bool,
}

impl Ring {
    /// No tokens yet, `rows` unpadded rows.
    pub fn empty(geo: Geometry, rows: usize) -> Self {
        Self {
            geo,
            keys: None,
            values: None,
            left_pad: vec![0; rows],
            offsets: vec![0; rows],
            idx: 0,
            seen: 0,
            rotated: false,
        }
    }

    pub fn rows(&self) -> usize {
        self.offsets.len()
    }

    /// `n` columns left the front of the storage: padding goes first.
    fn evict(&mut self, n: usize) {
        self.left_pad.iter_mut().for_each(|p| *p = p.saturating_sub(n));
    }

    fn advance(&mut self, l: usize) {
        self.offsets.iter_mut().for_each(|o| *o += l as i64);
        self.seen += l;
    }

    /// mlx-lm `_temporal_order`: a rotated ring unrolled oldest first.
    pub fn temporal_order(&mut self) -> Result<()> {
        if self.rotated {
            let shift = -(self.idx as isize);
            self.keys = self.keys.as_ref().map(|k| roll(k, shift)).transpose()?;
            self.values = self.values.as_ref().map(|v| roll(v, shift)).transpose()?;
            self.idx = self.keys.as_ref().map_or(0, len);
            self.rotated = false;
        }
        Ok(())
    }

    /// Storage cut to its written columns in temporal order (what row
    /// operations and the per-row rollback work on).
    pub fn linear(&mut self) -> Result<()> {
        self.temporal_order()?;
        if let (Some(k), Some(v)) = (self.keys.take(), self.values.take()) {
            self.keys = Some(cols(&k, 0, self.idx)?);
            self.values = Some(cols(&v, 0, self.idx)?);
        }
        Ok(())
    }

    /// Appends `[B, H, L, D]` keys and values; returns what to attend over.
    pub fn store(&mut self, k: Array, v: Array) -> Result<(Array, Array)> {
        if len(&k) == 1 {
            self.update_in_place(k, v)
        } else {
            self.update_concat(k, v)
        }
    }

    /// mlx-lm `_update_concat` (several tokens at once).
    fn update_concat(&mut self, k: Array, v: Array) -> Result<(Array, Array)> {
        let l = len(&k);
        if self.keys.is_some() {
            self.temporal_order()?;
            // Slice off the end if the storage grew past what is written.
            let (ok, ov) = (self.keys.take().unwrap(), self.values.take().unwrap());
            let (ok, ov) = (cols(&ok, 0, self.idx)?, cols(&ov, 0, self.idx)?);
            // At most max_size - 1 old columns, so that every new token sees
            // at least max_size keys.
            let trim = (self.idx + 1).saturating_sub(self.geo.max_size);
            self.evict(trim);
            self.keys = Some(cat(vec![cols(&ok, trim, len(&ok))?, k])?);
            self.values = Some(cat(vec![cols(&ov, trim, len(&ov))?, v])?);
        } else {
            self.keys = Some(k);
            self.values = Some(v);
        }
        self.advance(l);
        self.idx = len(self.keys.as_ref().unwrap());
        Ok((self.keys.clone().unwrap(), self.values.clone().unwrap()))
    }

    /// mlx-lm `_update_in_place` (one token per row): grow, trim, rotate, assign.
    fn update_in_place(&mut self, k: Array, v: Array) -> Result<(Array, Array)> {
        let Geometry { max_size, step, heads, k_dim, v_dim, .. } = self.geo;
        let (b, s) = (k.shape()[0], len(&k));
        let prev = self.seen;
        let grow = match &self.keys {
            None => true,
            Some(ks) => prev >= len(ks) && len(ks) < max_size,
        };
        if grow {
            let new_size = step.min(max_size.saturating_sub(prev));
            if new_size == 0 {
                return Err(error(format!("kv-rotating: no room to grow (at {prev}, max_size {max_size})")));
            }
            let (ks, vs) =
                grown(self.keys.take(), self.values.take(), [b, heads, new_size as i32], (&k, k_dim), (&v, v_dim))?;
            (self.keys, self.values) = (Some(ks), Some(vs));
            self.idx = prev;
        }
        let (ks, vs) = (self.keys.take().unwrap(), self.values.take().unwrap());
        // Trim storage left over from a multi-token step.
        let trim = len(&ks).saturating_sub(max_size);
        let (ks, vs) = if trim > 0 {
            self.idx = max_size;
            self.evict(trim);
            (cols(&ks, trim, len(&ks))?, cols(&vs, trim, len(&vs))?)
        } else {
            (ks, vs)
        };
        // Rotate: from here on every write overwrites a row's oldest column.
        if self.idx == max_size {
            self.rotated = true;
            self.idx = 0;
        }
        if self.rotated {
            self.evict(s);
        }
        let (start, end) = (self.idx as i32, (self.idx + s) as i32);
        let ks = slice_update(&ks, &k, &[0, 0, start, 0], &[b, heads, end, k_dim])?;
        let vs = slice_update(&vs, &v, &[0, 0, start, 0], &[b, heads, end, v_dim])?;
        self.keys = Some(ks);
        self.values = Some(vs);
        self.advance(s);
        self.idx += s;
        self.keys_and_values()
    }

    /// mlx-lm `keys_and_values`: the storage, cut to what the timeline has
    /// reached while it is not full yet.
    fn keys_and_values(&self) -> Result<(Array, Array)> {
        let (k, v) = (self.keys.as_ref().unwrap(), self.values.as_ref().unwrap());
        if self.seen < len(k) {
            Ok((cols(k, 0, self.seen)?, cols(v, 0, self.seen)?))
        } else {
            Ok((k.clone(), v.clone()))
        }
    }

    /// The rows' common offset when they agree (one RoPE position), else `None`.
    pub fn common_offset(&self) -> Option<i64> {
        let first = *self.offsets.first()?;
        (first >= 0 && self.offsets.iter().all(|&o| o == first)).then_some(first)
    }

    /// The longest row's tokens.
    pub fn max_offset(&self) -> u64 {
        self.offsets.iter().copied().max().unwrap_or(0).max(0) as u64
    }

    /// mlx-lm `is_trimmable`: only until the ring has wrapped.
    pub fn trimmable(&self) -> bool {
        self.seen < self.geo.max_size
    }

    /// mlx-lm `trim`, refused (0) once the ring has wrapped and never below
    /// a row's first token.
    pub fn trim(&mut self, n: u64) -> u64 {
        if !self.trimmable() {
            return 0;
        }
        let floor = self.left_pad.iter().copied().max().unwrap_or(0);
        let n = (n as usize).min(self.seen).min(self.idx.saturating_sub(floor));
        self.seen -= n;
        self.idx -= n;
        self.offsets.iter_mut().for_each(|o| *o -= n as i64);
        n as u64
    }

    /// What one more token adds: a slot per row while the ring is filling,
    /// nothing once it is full (a new token overwrites the oldest). A step
    /// of L tokens briefly holds `max_size - 1 + L`.
    pub fn bytes_per_token(&self) -> u64 {
        if self.seen >= self.geo.max_size {
            0
        } else {
            self.rows().max(1) as u64 * self.geo.token_bytes()
        }
    }
}
