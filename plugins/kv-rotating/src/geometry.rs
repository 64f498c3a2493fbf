//! What a cache is built for: the ring's size, the attention window, the
//! growth step, and the shape and dtype of the keys and values.

use model_kit::ops::dtype_size;
use model_kit::{Array, Dtype};
use plugin_api::abi_stable::std_types::RString;
use plugin_api::PluginError;
use plugin_sdk::kv_need::KvShape;

#[derive(Clone, Copy, Debug)]
pub(crate) struct Geometry {
    /// Slots in the ring (mlx-lm `max_size`); `new_cache` makes it the
    /// window, as mlx-lm's `make_cache` does for sliding layers.
    pub max_size: usize,
    /// The attention window (`window_size` of mlx-lm's `make_mask`).
    pub window: usize,
    /// Growth step in tokens while the ring fills.
    pub step: usize,
    pub heads: i32,
    pub k_dim: i32,
    pub v_dim: i32,
    pub dtype: Dtype,
}

impl Geometry {
    /// The layout's identity: a state imports only where it matches.
    pub fn signature(&self) -> RString {
        format!("kv:rotating:w{}:{:?}:h{}:k{}:v{}", self.window, self.dtype, self.heads, self.k_dim, self.v_dim)
            .to_lowercase()
            .into()
    }

    /// Fails unless `k` is `[B, heads, L, k_dim]` and `v` `[B, heads, L, v_dim]`
    /// (the row count is the caller's to check).
    pub fn check_kv(&self, k: &Array, v: &Array) -> Result<(), PluginError> {
        KvShape { heads: self.heads, k_dim: self.k_dim, v_dim: self.v_dim }.check("kv-rotating", k, v)
    }

    /// Bytes one token takes in one row, keys and values.
    pub fn token_bytes(&self) -> u64 {
        (self.heads as usize * (self.k_dim + self.v_dim) as usize * dtype_size(self.dtype)) as u64
    }
}
