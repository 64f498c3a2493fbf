//! What the gated delta recurrence gives, by either route (MLX's ops in
//! `delta`, the CUDA kernel in `delta_kernel`).

use model_kit::Array;

/// What the recurrence over a call's tokens gives: `y` `[B, T, Hv, Dv]`
/// (q's dtype), the final state `[B, Hv, Dv, Dk]` float32, and when asked
/// the state after each token `[B, T, Hv, Dv, Dk]`.
pub struct Recurrence {
    pub y: Array,
    pub state: Array,
    pub states: Option<Array>,
}
