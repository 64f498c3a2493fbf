//! The state itself: fixed-size slots per row, as mlx-lm's `ArraysCache`
//! keeps them, plus the row operations and the snapshot of a round.

use model_kit::ops::{on_gpu, slice, zeros};
use model_kit::{error, Array, Dtype, Result};
use plugin_sdk::mlx_rs;

/// One layer's recurrent state for `offsets.len()` rows.
#[derive(Clone)]
pub(crate) struct State {
    /// Slot `i` is `[rows, ..shapes[i]]`, or None until the graph first
    /// writes it (mlx-lm's `cache[i] is None`: the graph starts from zeros).
    pub slots: Vec<Option<Array>>,
    /// Real tokens seen, per row (padding columns are not counted).
    pub offsets: Vec<u64>,
    /// Padding columns still to come at the front of each row's next
    /// updates (`begin_padded`); 0 once a row's padding is consumed.
    pub pads: Vec<u64>,
    /// After a rollback restored the round's start: how many of the next
    /// update's columns are row r's kept tokens, replayed by the host in one
    /// forward for all rows (the filler columns after them are padding).
    pub replay: Option<Vec<u64>>,
}

impl State {
    pub fn empty(slots: usize, rows: usize) -> Self {
        Self { slots: vec![None; slots], offsets: vec![0; rows], pads: vec![0; rows], replay: None }
    }

    /// An empty state of `pads.len()` rows whose next columns begin with
    /// `pads[r]` padding ones.
    pub fn padded(slots: usize, pads: &[u32]) -> Self {
        Self {
            slots: vec![None; slots],
            offsets: vec![0; pads.len()],
            pads: pads.iter().map(|&p| p as u64).collect(),
            replay: None,
        }
    }

    /// Whether padding columns are still to come.
    pub fn padding_pending(&self) -> bool {
        self.pads.iter().any(|&p| p > 0)
    }

    /// mlx-lm's `ArraysCache.make_mask` with `left_padding`: bool `[B, l]`,
    /// true for the real columns of the next `l`, or None when every column
    /// is real (mlx-lm's all-true mask changes nothing). A pending replay
    /// marks the columns after each row's kept tokens as padding instead.
    pub fn mask(&self, l: usize) -> Option<Array> {
        let real: Vec<bool> = match &self.replay {
            Some(counts) if counts.iter().any(|&n| n < l as u64) => {
                counts.iter().flat_map(|&n| (0..l as u64).map(move |c| c < n)).collect()
            }
            Some(_) => return None,
            None if self.padding_pending() => {
                self.pads.iter().flat_map(|&p| (0..l as u64).map(move |c| c >= p)).collect()
            }
            None => return None,
        };
        Some(Array::from_slice(&real, &[self.rows() as i32, l as i32]))
    }

    pub fn rows(&self) -> usize {
        self.offsets.len()
    }

    /// The conv window for `inputs` `[B, L, C]`: the stored last `keep`
    /// inputs (zeros in the inputs' dtype when none are stored yet) followed
    /// by the new ones. The new last `keep` become slot 0 and every row
    /// advances by L, as mlx-lm's GatedDeltaNet does with `cache[0]` and
    /// `cache.advance(S)`: padding columns (zeroed by the graph, mlx-lm's
    /// `where(mask, qkv, 0)`) are consumed first and not counted, so a
    /// padded row's window ends in its real inputs, after zeros, exactly as
    /// had it run alone.
    pub fn conv_window(&mut self, inputs: &Array, keep: i32) -> Result<Array> {
        let s = inputs.shape();
        let (b, l, c) = (s[0], s[1], s[2]);
        let stored = match &self.slots[0] {
            Some(a) => a.clone(),
            None => zeros(&[b, keep, c], inputs.dtype())?,
        };
        if self.replay.is_none() && on_gpu() {
            // One kernel for the window and its tail (`conv_window`).
            if let Some((window, tail)) = model_kit::conv_window::step(&stored, inputs)? {
                self.slots[0] = Some(tail);
                self.advance(l);
                return Ok(window);
            }
        }
        let window = mlx_rs::ops::concatenate(&[stored, inputs.clone()], 1)?;
        if let Some(counts) = self.replay.clone() {
            // Consumed only by an update that could replay it.
            let window = self.replayed(window, &counts, keep)?;
            self.replay = None;
            return Ok(window);
        }
        let total = keep + l;
        self.slots[0] = Some(slice(&window, &[0, total - keep, 0], &[b, total, c])?.contiguous()?);
        self.advance(l);
        Ok(window)
    }

    /// Every row past an update of `l` columns: its padding columns are
    /// consumed first and not counted.
    fn advance(&mut self, l: i32) {
        for (o, p) in self.offsets.iter_mut().zip(self.pads.iter_mut()) {
            let padding = (*p).min(l as u64);
            *p -= padding;
            *o += l as u64 - padding;
        }
    }

    /// A replay's update (`window` = stored inputs, then the new columns):
    /// row r's real inputs are its first `counts[r]` new columns, so its
    /// window ends there (a gather per row) and it advances by that count.
    fn replayed(&mut self, window: Array, counts: &[u64], keep: i32) -> Result<Array> {
        let s = window.shape().to_vec();
        let (b, l, c) = (s[0], s[1] - keep, s[2]);
        if counts.iter().any(|&n| n > l as u64) {
            return Err(error(format!(
                "state-recurrent: a replay of {counts:?} kept tokens got an update of {l} columns"
            )));
        }
        let idx: Vec<i32> = counts.iter().flat_map(|&n| (0..keep).map(move |j| n as i32 + j)).collect();
        let idx = mlx_rs::ops::broadcast_to(Array::from_slice(&idx, &[b, keep, 1]), &[b, keep, c])?;
        self.slots[0] = Some(window.take_along_axis(&idx, 1)?);
        for (o, n) in self.offsets.iter_mut().zip(counts) {
            *o += n;
        }
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
        self.pads = keep.iter().map(|&r| self.pads[r as usize]).collect();
        if let Some(counts) = self.replay.as_mut() {
            *counts = keep.iter().map(|&r| counts[r as usize]).collect();
        }
        Ok(())
    }

    /// Row `r` alone.
    pub fn row(&self, r: usize) -> Result<State> {
        if r >= self.rows() {
            return Err(error(format!("extract_row: row {r} out of range (rows = {})", self.rows())));
        }
        let slots =
            self.slots.iter().map(|s| s.as_ref().map(|a| rows_of(a, r, r + 1)).transpose()).collect::<Result<_>>()?;
        Ok(State {
            slots,
            offsets: vec![self.offsets[r]],
            pads: vec![self.pads[r]],
            replay: self.replay.as_ref().map(|c| vec![c[r]]),
        })
    }

    /// Appends the rows of `others` after ours, along the batch axis. Rows
    /// keep their own state (no padding: each was prefilled on its own). A
    /// slot one side has not written yet is zeros there, which is what the
    /// graph would have started that row from (mlx-lm's `ArraysCache.extend`).
    pub fn append(&mut self, others: Vec<State>, shapes: &[Vec<i64>]) -> Result<()> {
        if self.replay.is_some() {
            return Err(error(
                "state-recurrent: rows cannot merge while a replay is pending (replay the kept tokens first)",
            ));
        }
        let mut parts = vec![std::mem::replace(self, State::empty(shapes.len(), 0))];
        parts.extend(others);
        let parts: Vec<State> = parts.into_iter().filter(|p| p.rows() > 0).collect();
        let mut slots = Vec::with_capacity(shapes.len());
        for (i, shape) in shapes.iter().enumerate() {
            let dtype = parts.iter().find_map(|p| p.slots[i].as_ref().map(Array::dtype));
            slots.push(match dtype {
                None => None,
                Some(dt) => Some(mlx_rs::ops::concatenate(
                    &parts.iter().map(|p| filled(p, i, shape, dt)).collect::<Result<Vec<_>>>()?,
                    0,
                )?),
            });
        }
        self.slots = slots;
        self.offsets = parts.iter().flat_map(|p| p.offsets.iter().copied()).collect();
        self.pads = parts.iter().flat_map(|p| p.pads.iter().copied()).collect();
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
