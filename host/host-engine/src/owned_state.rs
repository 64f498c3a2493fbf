//! Exported cache state that owns exactly its bytes.
//!
//! A layout's `export_state` / `extract_row` may return lazy slices or
//! gathers of its storage: a row cut out of a `[B, H, capacity, D]` batch
//! buffer, or the used columns of a 1-row buffer grown in steps of 256. Kept
//! as they are, such tensors keep the whole source buffer alive (a lazy
//! graph holds its inputs; an evaluated slice is a view into them), and a
//! source buffer that is still referenced cannot be updated in place, so the
//! next decode step copies it. `own` turns every tensor into an array whose
//! buffer is its own: MLX's `contiguous` copies whenever the source buffer
//! is more than 16 KiB larger than the tensor (`Contiguous::eval_*`), and
//! evaluating detaches the result from its graph.
//!
//! The copies are queued (`async_eval`), not waited for: a batch retires
//! rows while its next step is already on the device, and waiting for the
//! copies would wait for that step too, leaving the host idle where it
//! should build the step after it. Anything that reads the bytes on the
//! host (the SSD tier) calls [`wait`] first.

use crate::error::EngineError;
use mlx_rs::Array;
use plugin_api::abi_stable::std_types::RVec;
use plugin_api::{CacheState, Tensor};

/// What a tensor may hold beyond its own bytes after `own`: MLX shares a
/// row-contiguous source buffer instead of copying when it is at most this
/// much larger than the tensor.
pub const SLACK_PER_TENSOR: usize = 16 << 10;

fn contiguous(a: &Array) -> Result<Array, EngineError> {
    let stream = mlx_rs::Stream::thread_local_or_default();
    let mut res = unsafe { mlx_sys::mlx_array_new() };
    if unsafe { mlx_sys::mlx_contiguous(&mut res, a.as_ptr(), false, stream.as_ptr()) } != 0 {
        unsafe { mlx_sys::mlx_array_free(res) };
        return Err(EngineError::Mlx("contiguous copy of a cache state failed".into()));
    }
    Ok(unsafe { Array::from_ptr(res) })
}

/// Copies every tensor of `states` into a buffer of its own, all queued on
/// the device at once (nothing waits for them here).
pub fn own(states: Vec<CacheState>) -> Result<Vec<CacheState>, EngineError> {
    let mut out = Vec::with_capacity(states.len());
    let mut all: Vec<Array> = Vec::new();
    for s in states {
        let CacheState { signature, offset, tensors, meta } = s;
        let mut owned = RVec::with_capacity(tensors.len());
        for t in tensors {
            let a = crate::tensors::tensor_array(t);
            let c = contiguous(&a)?;
            all.push(c.clone());
            owned.push(unsafe { Tensor::from_raw(new_handle(c.as_ptr())) });
        }
        out.push(CacheState { signature, offset, tensors: owned, meta });
    }
    mlx_rs::transforms::async_eval(all.iter())?;
    Ok(out)
}

/// Waits until every tensor of `states` is computed, so that its bytes can
/// be read on the host.
pub fn wait(states: &[CacheState]) -> Result<(), EngineError> {
    let arrays: Vec<Array> = states
        .iter()
        .flat_map(|s| s.tensors.iter())
        .map(|t| unsafe { Array::from_ptr(new_handle(t.as_raw())) })
        .collect();
    mlx_rs::transforms::eval(arrays.iter())?;
    Ok(())
}

/// Bytes the tensors of `states` take from MLX's allocator (their sizes as
/// it rounds them, `runtime::allocation_bytes`); after `own`, also what
/// they keep alive, within `SLACK_PER_TENSOR` each.
pub fn bytes(states: &[CacheState]) -> usize {
    states
        .iter()
        .flat_map(|s| s.tensors.iter())
        .map(|t| crate::runtime::allocation_bytes(unsafe { mlx_sys::mlx_array_nbytes(t.as_raw()) }))
        .sum()
}

/// A new owned raw handle to the same array.
fn new_handle(a: mlx_sys::mlx_array) -> mlx_sys::mlx_array {
    let mut out = unsafe { mlx_sys::mlx_array_new() };
    unsafe { mlx_sys::mlx_array_set(&mut out, a) };
    out
}
