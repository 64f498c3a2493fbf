//! Arrays across the plugin boundary (a borrowed view lent, an owned
//! handle taken back) and token ids as the graph's int32 input.

use mlx_rs::Array;
use plugin_api::{Tensor, TensorRef};

pub(crate) fn tensor_ref(a: &Array) -> TensorRef<'_> {
    unsafe { TensorRef::from_raw(a.as_ptr()) }
}

/// The array a plugin handed over (its handle, now the host's).
pub(crate) fn tensor_array(t: Tensor) -> Array {
    unsafe { Array::from_ptr(t.into_raw()) }
}

/// int32 `[1, L]` token ids.
pub fn token_array(ids: &[u32]) -> Array {
    let v: Vec<i32> = ids.iter().map(|&t| t as i32).collect();
    Array::from_slice(&v, &[1, v.len() as i32])
}

/// int32 `[B, L]` token ids from B rows of L ids each.
pub(crate) fn token_array_rows(rows: &[Vec<u32>]) -> Array {
    let width = rows.first().map_or(0, Vec::len);
    let v: Vec<i32> = rows.iter().flat_map(|r| r.iter().map(|&t| t as i32)).collect();
    Array::from_slice(&v, &[rows.len() as i32, width as i32])
}
