//! The target's states a drafter reads (`Drafter::target_wants`): asked of
//! the target's own forward passes (prefill chunks and verifies), kept by
//! the host for the call that hands them over, lent as `TargetStates`.

use crate::error::EngineError;
use crate::tensors::{tensor_array, tensor_ref};
use mlx_rs::Array;
use plugin_api::abi_stable::std_types::{ROption, RSlice};
use plugin_api::{ForwardOutput, TargetStates, TargetWants, TensorRef};

/// States over positions `first..first + len`, owned by the host.
#[derive(Default)]
pub(crate) struct States {
    pub first: u64,
    pub len: u64,
    pub hidden: Option<Array>,
    pub taps: Vec<Array>,
}

impl States {
    /// Takes what `wants` asked for out of a forward's output (the rest of
    /// it, logits, stays with the caller).
    pub fn take(out: &mut ForwardOutput, wants: &TargetWants, first: u64, len: u64) -> Result<Self, EngineError> {
        let hidden = match (wants.hidden, std::mem::replace(&mut out.hidden, ROption::RNone)) {
            (true, ROption::RSome(h)) => Some(tensor_array(h)),
            (true, ROption::RNone) => return Err(EngineError::Model("the target returned no hidden state".into())),
            (false, _) => None,
        };
        let taps: Vec<Array> = std::mem::take(&mut out.taps).into_iter().map(tensor_array).collect();
        if taps.len() != wants.taps.len() {
            return Err(EngineError::Model(format!(
                "the target returned {} hidden taps, the drafter asked for {}",
                taps.len(),
                wants.taps.len()
            )));
        }
        Ok(Self { first, len, hidden, taps })
    }

    /// Appends the next chunk's states (consecutive positions).
    pub fn extend(&mut self, next: States) -> Result<(), EngineError> {
        if self.len == 0 {
            *self = next;
            return Ok(());
        }
        let cat = |a: &Array, b: &Array| mlx_rs::ops::concatenate(&[a, b], 1);
        if let (Some(a), Some(b)) = (&self.hidden, &next.hidden) {
            self.hidden = Some(cat(a, b)?);
        }
        for (a, b) in self.taps.iter_mut().zip(&next.taps) {
            *a = cat(a, b)?;
        }
        self.len += next.len;
        Ok(())
    }

    /// Row `row` of batched states `[B, L, H]`, its first `len` positions,
    /// the first of which is sequence position `first`.
    pub fn row(&self, row: i32, len: u64, first: u64) -> Result<States, EngineError> {
        use mlx_rs::ops::indexing::IndexOp;
        let cut = |a: &Array| a.index((row..row + 1, 0..len as i32));
        Ok(States { first, len, hidden: self.hidden.as_ref().map(cut), taps: self.taps.iter().map(cut).collect() })
    }

    /// Lends the states for one call.
    pub fn lend<R>(&self, f: impl FnOnce(TargetStates<'_>) -> R) -> R {
        let taps: Vec<TensorRef<'_>> = self.taps.iter().map(tensor_ref).collect();
        f(TargetStates {
            first: self.first,
            len: self.len,
            hidden: match &self.hidden {
                Some(h) => ROption::RSome(tensor_ref(h)),
                None => ROption::RNone,
            },
            taps: RSlice::from_slice(&taps),
        })
    }
}
