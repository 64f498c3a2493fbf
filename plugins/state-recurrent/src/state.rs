//! The state itself: fixed-size slots per row, as mlx-lm's `ArraysCache`
//! keeps them, plus the row operations and the snapshot of a round.

use model_kit::ops::{slice, zeros};
use model_kit::{error, Array, Dtype, Result};
use plugin_sdk::mlx_rs;

/// One layer's recurrent state for `offsets.len()` rows.
#[derive(Clone)]
pub(crate) struct State {
    /// Slot `i` is `[rows, ..shapes[i]]`, or None until the graph first
    /// writes it (mlx-lm's `cache[i] is None`: the graph starts from zeros).
    pub slots: Vec<Option<Array>>,
    /// Tokens seen, per row.
    pub offsets: Vec<u64>,
}

impl State {
    pub fn empty(slots: usize, rows: usize) -> Self {
        Self { slots: vec![None; slots], offsets: vec![0; rows] }
    }

    pub fn rows(&self) -> usize {
        self.offsets.len()
    }

    /// The conv window for `inputs` `[B, L, C]`: the stored last `keep`
    /// inputs (zeros in the inputs' dtype when none are stored yet) followed
    /// by the new ones. The new last `keep` become slot 0 and every row
    /// advances by L, as mlx-lm's GatedDeltaNet does with `cache[0]` and
    /// `cache.advance(S)`.
    pub fn conv_window(&mut self, inputs: &Array, keep: i32) -> Result<Array> {
        let s = inputs.shape();
        let (b, l, c) = (s[0], s[1], s[2]);
        let stored = match &self.slots[0] {
            Some(a) => a.clone(),
            None => zeros(&[b, keep, c], inputs.dtype())?,
        };
        let window = mlx_rs::ops::concatenate(&[stored, inputs.clone()], 1)?;
        let total = keep + l;
        self.slots[0] = Some(slice(&window, &[0, total - keep, 0], &[b, total, c])?.contiguous()?);
        self.offsets.iter_mut().for_each(|o| *o += l as u64);
        Ok(window)
    }

    /// Keeps the listed rows, in that order.
    pub fn filter(&mut self, keep: &[u32]) -> Result<()> {
        if let Some(&bad) = keep.iter().find(|&&r| r as usize >= self.rows()) {
            return Err(error(format!("filter_rows: row {bad} out of range (rows = {})", self.rows())));
        }
        let idx: Vec<i32> = keep.iter().map(|&r| r as i32).collect();
        let sel = Array::from_slice(&idx, &[idx.len() as i32]);
        for s in self.slots.iter_mut() {
            if let Some(a) = s.take() {
                *s = if keep.is_empty() { None } else { Some(a.take_axis(&sel, 0)?) };
            }
        }
        self.offsets = keep.iter().map(|&r| self.offsets[r as usize]).collect();
        Ok(())
    }

    /// Row `r` alone.
    pub fn row(&self, r: usize) -> Result<State> {
        if r >= self.rows() {
            return Err(error(format!("extract_row: row {r} out of range (rows = {})", self.rows())));
        }
        let slots = self.slots.iter().map(|s| s.as_ref().map(|a| rows_of(a, r, r + 1)).transpose()).collect::<Result<_>>()?;
        Ok(State { slots, offsets: vec![self.offsets[r]] })
    }

    /// Appends the rows of `others` after ours, along the batch axis. Rows
    /// keep their own state (no padding: each was prefilled on its own). A
    /// slot one side has not written yet is zeros there, which is what the
    /// graph would have started that row from (mlx-lm's `ArraysCache.extend`).
    pub fn append(&mut self, others: Vec<State>, shapes: &[Vec<i64>]) -> Result<()> {
        let mut parts = vec![std::mem::replace(self, State::empty(shapes.len(), 0))];
        parts.extend(others);
        let parts: Vec<State> = parts.into_iter().filter(|p| p.rows() > 0).collect();
        let mut slots = Vec::with_capacity(shapes.len());
        for (i, shape) in shapes.iter().enumerate() {
            let dtype = parts.iter().find_map(|p| p.slots[i].as_ref().map(Array::dtype));
            slots.push(match dtype {
                None => None,
                Some(dt) => Some(mlx_rs::ops::concatenate(&parts.iter().map(|p| filled(p, i, shape, dt)).collect::<Result<Vec<_>>>()?, 0)?),
            });
        }
        self.slots = slots;
        self.offsets = parts.iter().flat_map(|p| p.offsets.iter().copied()).collect();
        Ok(())
    }
}

/// Rows `from..to` of a slot.
fn rows_of(a: &Array, from: usize, to: usize) -> Result<Array> {
    let s = a.shape();
    let mut start = vec![0; s.len()];
    let mut stop = s.to_vec();
    start[0] = from as i32;
    stop[0] = to as i32;
    slice(a, &start, &stop)
}

/// Slot `i` of `p`, or zeros of its rows when `p` has not written it.
fn filled(p: &State, i: usize, shape: &[i64], dtype: Dtype) -> Result<Array> {
    match &p.slots[i] {
        Some(a) => Ok(a.clone()),
        None => {
            let mut full = vec![p.rows() as i32];
            full.extend(shape.iter().map(|&d| d as i32));
            zeros(&full, dtype)
        }
    }
}
