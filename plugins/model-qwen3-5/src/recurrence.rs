//! What the gated delta recurrence's two routes (MLX's ops in `delta`, the
//! CUDA kernel in `delta_kernel`) share: the q/k norms' constants, and what
//! the recurrence gives.

use model_kit::Array;

/// What the recurrence over a call's tokens gives: `y` `[B, T, Hv, Dv]`
/// (q's dtype), the final state `[B, Hv, Dv, Dk]` float32, and when asked
/// the state after each token `[B, T, Hv, Dv, Dk]`.
pub struct Recurrence {
    pub y: Array,
    pub state: Array,
    pub states: Option<Array>,
}

/// `normalize_qk`'s constants for a key head dim: the norms' eps and the
/// scales folded into q and k (the delta kernel takes the same).
pub struct QkNorm {
    pub eps: f32,
    pub q_scale: f64,
    pub k_scale: f64,
}

impl QkNorm {
    /// The reference L2 eps (1e-6, added to the sum of squares) moved onto
    /// the mean, and the `Dk**-0.5` readout scale folded into q (squared)
    /// and k.
    pub fn of(dk: usize) -> Self {
        let inv_scale = (dk as f64).powf(-0.5);
        Self { eps: (1e-6 * inv_scale * inv_scale) as f32, q_scale: inv_scale * inv_scale, k_scale: inv_scale }
    }
}
