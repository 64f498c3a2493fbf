//! The pipelined decode step: queued on the device before the previous
//! step's tokens are read.

use crate::error::EngineError;
use mlx_rs::Array;

/// A decode step queued on the device whose tokens are not read yet. Its
/// input, each row's pending token, is already in the batch caches.
pub(super) struct Ahead {
    /// The sampled tokens `[B]` (uint32).
    pub(super) y: Array,
    /// Each row's logprobs `[1, V]`.
    pub(super) lps: Vec<Array>,
}

impl Ahead {
    /// Only the rows in `keep` (indices into the rows it was built for).
    pub(super) fn keep(self, keep: &[u32], rows: usize) -> Result<Self, EngineError> {
        if keep.len() == rows {
            return Ok(self);
        }
        let idx = Array::from_slice(keep, &[keep.len() as i32]);
        let y = self.y.take_axis(&idx, 0)?;
        let mut lps: Vec<Option<Array>> = self.lps.into_iter().map(Some).collect();
        let lps = keep.iter().map(|&i| lps[i as usize].take().expect("kept rows are distinct")).collect();
        Ok(Self { y, lps })
    }
}
