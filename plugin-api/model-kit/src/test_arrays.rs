//! Arrays the unit tests build their inputs from.

use crate::Array;

/// Standard normal float32 values of `shape`, the same for the same `seed`.
pub fn normal(shape: &[i32], seed: u64) -> Array {
    let key = mlx_rs::random::key(seed).unwrap();
    mlx_rs::random::normal::<f32>(shape, None, None, Some(&key)).unwrap()
}
