//! Rows of a batch in one ring, as mlx-lm's `BatchRotatingKVCache` keeps
//! them (mlx-lm 0.32.2, `mlx_lm/models/cache.py`).
//!
//! All rows share the storage `[B, H, n, D]`, the write index (`_idx`), the
//! shared token count (`_offset`, here `seen`) and whether the ring has
//! rotated; rows differ by their left padding (columns before their first
//! token, in temporal order) and their offsets (tokens seen: RoPE positions).
//! Updates are mlx-lm's, op for op: several tokens at once put the ring in
//! temporal order, keep its last `max_size - 1` columns and append; one
//! token at a time grows the storage to `max_size`, then overwrites the
//! oldest slot. Every eviction or overwrite eats a column of each row's
//! padding first. The mask combines causal, window and padding, built in
//! temporal order and rolled to storage order once the ring has rotated.
//!
//! One deliberate difference: mlx-lm keeps left padding as signed integers
//! that go negative once a row's padding is used up, and `extend` adds new
//! padding to that negative count (hiding too few columns). Here the padding
//! stops at 0, so it always counts the columns to hide.

use crate::{cat, cols, grown, len, RotatingKv};
use model_kit::ops::slice_update;
use model_kit::{error, Array, Dtype, Result};

/// What rolls back a speculative round (`round.rs`).
pub(crate) struct Round {
    pub snapshot: Snapshot,
    /// Updates since `spec_begin`, and the tokens they appended per row.
    pub updates: usize,
    pub appended: usize,
}

/// The row state of the whole cache (MLX arrays are immutable: handles suffice).
pub(crate) struct Snapshot {
    pub keys: Option<Array>,
    pub values: Option<Array>,
    pub left_pad: Vec<usize>,
    pub offsets: Vec<i64>,
    pub idx: usize,
    pub seen: usize,
    pub rotated: bool,
}

pub(crate) struct BatchRotatingKv {
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
    /// Columns the storage timeline has advanced (mlx-lm `_offset`): the
    /// longest row's tokens, at most the ring's, plus later steps.
    pub seen: usize,
    /// Whether single-token steps wrapped the write index (storage order is
    /// then not temporal order).
    pub rotated: bool,
    pub max_size: usize,
    pub window: usize,
    pub step: usize,
    pub heads: i32,
    pub k_dim: i32,
    pub v_dim: i32,
    pub dtype: Dtype,
    pub round: Option<Round>,
}

/// `a` rolled along axis 2 by `shift` (mlx `roll`: column j gets j - shift).
pub(crate) fn roll(a: &Array, shift: isize) -> Result<Array> {
    let n = len(a) as isize;
    let s = shift.rem_euclid(n.max(1)) as usize;
    if s == 0 {
        return Ok(a.clone());
    }
    let n = n as usize;
    cat(vec![cols(a, n - s, n)?, cols(a, 0, n - s)?])
}

impl BatchRotatingKv {
    /// An empty cache of `serial`'s geometry with `rows` unpadded rows.
    pub fn new(serial: &RotatingKv, rows: usize) -> Self {
        Self {
            keys: None,
            values: None,
            left_pad: vec![0; rows],
            offsets: vec![0; rows],
            idx: 0,
            seen: 0,
            rotated: false,
            max_size: serial.max_size,
            window: serial.window,
            step: serial.step,
            heads: serial.heads,
            k_dim: serial.k_dim,
            v_dim: serial.v_dim,
            dtype: serial.dtype,
            round: None,
        }
    }

    pub fn rows(&self) -> usize {
        self.offsets.len()
    }

    /// An empty serial cache of this geometry (signature, 1-row states).
    pub fn serial(&self) -> RotatingKv {
        RotatingKv {
            keys: None,
            values: None,
            offset: 0,
            idx: 0,
            max_size: self.max_size,
            keep: 0,
            step: self.step,
            window: self.window,
            heads: self.heads,
            k_dim: self.k_dim,
            v_dim: self.v_dim,
            dtype: self.dtype,
            round: None,
        }
    }

    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            keys: self.keys.clone(),
            values: self.values.clone(),
            left_pad: self.left_pad.clone(),
            offsets: self.offsets.clone(),
            idx: self.idx,
            seen: self.seen,
            rotated: self.rotated,
        }
    }

    pub fn restore(&mut self, s: Snapshot) {
        self.keys = s.keys;
        self.values = s.values;
        self.left_pad = s.left_pad;
        self.offsets = s.offsets;
        self.idx = s.idx;
        self.seen = s.seen;
        self.rotated = s.rotated;
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
            let trim = (self.idx + 1).saturating_sub(self.max_size);
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
        let (b, s) = (k.shape()[0], len(&k));
        let prev = self.seen;
        let grow = match &self.keys {
            None => true,
            Some(ks) => prev >= len(ks) && len(ks) < self.max_size,
        };
        if grow {
            let new_size = self.step.min(self.max_size.saturating_sub(prev));
            if new_size == 0 {
                return Err(error(format!("kv-rotating: no room to grow (at {prev}, max_size {})", self.max_size)));
            }
            let (ks, vs) = grown(
                self.keys.take(),
                self.values.take(),
                [b, self.heads, new_size as i32],
                (&k, self.k_dim),
                (&v, self.v_dim),
            )?;
            (self.keys, self.values) = (Some(ks), Some(vs));
            self.idx = prev;
        }
        let (ks, vs) = (self.keys.take().unwrap(), self.values.take().unwrap());
        // Trim storage left over from a multi-token step.
        let trim = len(&ks).saturating_sub(self.max_size);
        let (ks, vs) = if trim > 0 {
            self.idx = self.max_size;
            self.evict(trim);
            (cols(&ks, trim, len(&ks))?, cols(&vs, trim, len(&vs))?)
        } else {
            (ks, vs)
        };
        // Rotate: from here on every write overwrites a row's oldest column.
        if self.idx == self.max_size {
            self.rotated = true;
            self.idx = 0;
        }
        if self.rotated {
            self.evict(s);
        }
        let (start, end) = (self.idx as i32, (self.idx + s) as i32);
        let ks = slice_update(&ks, &k, &[0, 0, start, 0], &[b, self.heads, end, self.k_dim])?;
        let vs = slice_update(&vs, &v, &[0, 0, start, 0], &[b, self.heads, end, self.v_dim])?;
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

    pub fn store(&mut self, k: Array, v: Array) -> Result<(Array, Array)> {
        if len(&k) == 1 {
            self.update_in_place(k, v)
        } else {
            self.update_concat(k, v)
        }
    }

    /// mlx-lm `make_mask(n, window_size=window)`, asked before the update:
    /// `[B, 1, n, K]`, true where a row's query may attend.
    pub fn mask(&self, n: usize) -> Result<Array> {
        let offset = (self.max_size - 1).min(self.seen);
        let k = (offset + n) as i32;
        let rinds = Array::arange::<_, i32>(0, k, 1)?;
        let linds = Array::arange::<_, i32>(offset as i32, k, 1)?.reshape(&[n as i32, 1])?;
        let window = Array::from_int(self.window as i32);
        let mut mask = linds.ge(&rinds)?.logical_and(&linds.lt(&rinds.add(&window)?)?)?;
        // Columns the update will evict before writing (padding goes first).
        // A multi-token step on a rotated ring first unrolls it, so its
        // write index is then the storage length (mlx-lm reads `_idx`
        // before unrolling here and hides one column too many).
        let written = if n > 1 && self.rotated { self.keys.as_ref().map_or(0, len) } else { self.idx };
        let trim = (written + usize::from(n > 1)).saturating_sub(self.max_size);
        let rotated = n == 1 && (self.rotated || self.idx >= self.max_size);
        let pads: Vec<i32> =
            self.left_pad.iter().map(|p| p.saturating_sub(trim).saturating_sub(usize::from(rotated)) as i32).collect();
        let pads = Array::from_slice(&pads, &[self.rows() as i32, 1, 1, 1]);
        mask = mask.logical_and(&rinds.ge(&pads)?)?;
        if rotated {
            // Temporal order to storage order: the oldest column after the
            // write sits just past the write slot.
            let idx = if self.idx >= self.max_size { 0 } else { self.idx };
            // ([B, 1, 1, K] and [B, 1, K, 1] share their element order.)
            let b = self.rows() as i32;
            mask = roll(&mask.reshape(&[b, 1, k, 1])?, idx as isize + 1)?.reshape(&[b, 1, 1, k])?;
        }
        Ok(mask)
    }

    /// The rows' common offset when they agree (serial RoPE), else `None`.
    pub fn common_offset(&self) -> Option<i64> {
        let first = *self.offsets.first()?;
        (first >= 0 && self.offsets.iter().all(|&o| o == first)).then_some(first)
    }

    /// The longest row's tokens (`CacheLayout::offset`).
    pub fn max_offset(&self) -> u64 {
        self.offsets.iter().copied().max().unwrap_or(0).max(0) as u64
    }

    pub fn trimmable(&self) -> bool {
        self.seen < self.max_size
    }

    /// mlx-lm `trim`, refused (0) once the ring has wrapped and never below
    /// a row's first token.
    pub fn trim_tokens(&mut self, n: u64) -> u64 {
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

    /// Storage cut to its written columns in temporal order (the roll and
    /// rollback paths work on that).
    pub fn linear(&mut self) -> Result<()> {
        self.temporal_order()?;
        if let (Some(k), Some(v)) = (self.keys.take(), self.values.take()) {
            self.keys = Some(cols(&k, 0, self.idx)?);
            self.values = Some(cols(&v, 0, self.idx)?);
        }
        Ok(())
    }
}
