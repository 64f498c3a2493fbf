//! Attention masks for the next `n` queries, asked before the update, as
//! mlx-lm's two classes make them (`make_mask(n, window_size=window)`).
//! Both hide the same keys for one unpadded row. The serial class answers
//! with the fused kernel's modes where they suffice (none, causal) and
//! builds an array only once the window binds; the batched class always
//! builds `[B, 1, n, K]`, since its rows differ in padding. The two are
//! kept apart because the kernels the modes select round differently.

use crate::columns::{len, roll};
use crate::ring::Ring;
use model_kit::{Array, Result};
use plugin_api::AttentionMask;
use plugin_sdk::kv_need::{array_mask, implicit_mask};

/// mlx-lm `create_causal_mask(n, offset, window_size=window)` as `[1, 1, n, offset + n]`.
fn window_mask(n: usize, offset: usize, window: usize) -> Array {
    let k = offset + n;
    let mut m = Vec::with_capacity(n * k);
    for i in 0..n {
        let l = offset + i;
        for r in 0..k {
            m.push(l >= r && l < r + window);
        }
    }
    Array::from_slice(&m, &[1, 1, n as i32, k as i32])
}

impl Ring {
    /// mlx-lm `RotatingKVCache.make_mask`, for a ring of one unpadded row.
    pub fn serial_mask(&self, n: usize) -> AttentionMask {
        let (max_size, window) = (self.geo.max_size, self.geo.window);
        if n > 1 {
            let offset = (max_size - 1).min(self.seen);
            if offset + n > window {
                array_mask(window_mask(n, offset, window))
            } else {
                implicit_mask(n as u32)
            }
        } else if self.seen >= window && max_size > window {
            // Only when the window is narrower than the ring (never as
            // `new_cache` builds rings): the ring positions that are within
            // the window, rolled to storage order.
            let idx = if self.idx >= max_size { 0 } else { self.idx };
            let size = if self.seen < max_size { self.seen + 1 } else { max_size };
            let base: Vec<bool> = (0..size).map(|i| i >= size - window).collect();
            let shift = (idx + 1) % size;
            let rolled: Vec<bool> = (0..size).map(|j| base[(j + size - shift) % size]).collect();
            array_mask(Array::from_slice(&rolled, &[1, 1, 1, size as i32]))
        } else {
            implicit_mask(1)
        }
    }

    /// mlx-lm `BatchRotatingKVCache.make_mask`: `[B, 1, n, K]`, true where
    /// a row's query may attend (causal, window and padding).
    pub fn rows_mask(&self, n: usize) -> Result<Array> {
        let max_size = self.geo.max_size;
        let offset = (max_size - 1).min(self.seen);
        let k = (offset + n) as i32;
        let rinds = Array::arange::<_, i32>(0, k, 1)?;
        let linds = Array::arange::<_, i32>(offset as i32, k, 1)?.reshape(&[n as i32, 1])?;
        let window = Array::from_int(self.geo.window as i32);
        let mut mask = linds.ge(&rinds)?.logical_and(&linds.lt(&rinds.add(&window)?)?)?;
        // Columns the update will evict before writing (padding goes first).
        // A multi-token step on a rotated ring first unrolls it, so its
        // write index is then the storage length (mlx-lm reads `_idx`
        // before unrolling here and hides one column too many).
        let written = if n > 1 && self.rotated { self.keys.as_ref().map_or(0, len) } else { self.idx };
        let trim = (written + usize::from(n > 1)).saturating_sub(max_size);
        let rotated = n == 1 && (self.rotated || self.idx >= max_size);
        let pads: Vec<i32> =
            self.left_pad.iter().map(|p| p.saturating_sub(trim).saturating_sub(usize::from(rotated)) as i32).collect();
        let pads = Array::from_slice(&pads, &[self.rows() as i32, 1, 1, 1]);
        mask = mask.logical_and(&rinds.ge(&pads)?)?;
        if rotated {
            // Temporal order to storage order: the oldest column after the
            // write sits just past the write slot.
            let idx = if self.idx >= max_size { 0 } else { self.idx };
            // ([B, 1, 1, K] and [B, 1, K, 1] share their element order.)
            let b = self.rows() as i32;
            mask = roll(&mask.reshape(&[b, 1, k, 1])?, idx as isize + 1)?.reshape(&[b, 1, 1, k])?;
        }
        Ok(mask)
    }
}
