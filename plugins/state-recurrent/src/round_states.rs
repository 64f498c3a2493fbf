//! Rollback without a replay: the states after each position of a
//! speculative round's update, so that keeping `n` of its tokens picks the
//! state after position `n` instead of restoring the round's start for the
//! host to replay them. The conv window comes from the update itself (its
//! window holds every input of the round); the other slots' states come from
//! the graph (`set_position_states`), which computes them anyway.

use crate::state::State;
use model_kit::ops::zeros;
use model_kit::{error, Array, Result};
use plugin_sdk::mlx_rs;

/// What the round's first update left for an in-place rollback.
pub(crate) struct RoundStates {
    /// The update's conv window `[B, K-1+L, C]`: the inputs stored at the
    /// round's start, then the round's.
    window: Array,
    /// The update's width L.
    width: usize,
    /// Per slot, its state after each of the L positions `[B, L, ..]`
    /// (slot 0, the conv window, is never given: the window serves).
    states: Vec<Option<Array>>,
}

impl RoundStates {
    pub fn new(window: Array, width: usize, slots: usize) -> Self {
        Self { window, width, states: vec![None; slots] }
    }

    /// Slot `i`'s states after each position, `[B, L, ..]` = `want`.
    pub fn set(&mut self, i: usize, states: Array, want: &[i32]) -> Result<()> {
        if i == 0 || i >= self.states.len() {
            return Err(error(format!("state-recurrent: slot {i} takes no position states")));
        }
        if states.shape() != want {
            return Err(error(format!(
                "state-recurrent: position states of slot {i} must be {want:?}, got {:?}",
                states.shape()
            )));
        }
        self.states[i] = Some(states);
        Ok(())
    }

    pub fn width(&self) -> usize {
        self.width
    }

    /// Whether every slot past the conv window has its states.
    pub fn complete(&self) -> bool {
        self.states.iter().skip(1).all(Option::is_some)
    }

    /// The state of the round's start `start` advanced by `counts[r]` of
    /// the round's tokens in row r (each at most the width): slot 0 the
    /// window's `K-1` inputs ending at the row's last kept one, every other
    /// slot the state after its last kept position (the start's when it
    /// keeps none).
    pub fn settle(self, start: &State, counts: &[u64], shapes: &[Vec<i64>]) -> Result<State> {
        let rows = start.rows();
        let keep = shapes[0][0] as i32;
        let c = shapes[0][1] as i32;
        let b = rows as i32;
        let mut slots = Vec::with_capacity(shapes.len());
        let conv_idx: Vec<i32> = counts.iter().flat_map(|&n| (0..keep).map(move |j| n as i32 + j)).collect();
        let conv_idx = mlx_rs::ops::broadcast_to(Array::from_slice(&conv_idx, &[b, keep, 1]), &[b, keep, c])?;
        slots.push(Some(self.window.take_along_axis(&conv_idx, 1)?));
        for (i, states) in self.states.into_iter().enumerate().skip(1) {
            let states = states.ok_or_else(|| error(format!("state-recurrent: no position states for slot {i}")))?;
            let mut full = vec![b];
            full.extend(shapes[i].iter().map(|&d| d as i32));
            let before = match &start.slots[i] {
                Some(a) => a.as_dtype(states.dtype())?,
                None => zeros(&full, states.dtype())?,
            };
            // Position 0 is the round's start, position n the state after n tokens.
            let all = mlx_rs::ops::concatenate(&[before.expand_dims(1)?, states], 1)?;
            let mut idx_shape = vec![b, 1];
            idx_shape.extend(std::iter::repeat_n(1, full.len() - 1));
            let idx: Vec<i32> = counts.iter().map(|&n| n as i32).collect();
            let mut target = full.clone();
            target.insert(1, 1);
            let idx = mlx_rs::ops::broadcast_to(Array::from_slice(&idx, &idx_shape), &target)?;
            slots.push(Some(all.take_along_axis(&idx, 1)?.reshape(&full)?));
        }
        let offsets = start.offsets.iter().zip(counts).map(|(o, n)| o + n).collect();
        Ok(State { slots, offsets, pads: start.pads.clone(), replay: None })
    }
}
