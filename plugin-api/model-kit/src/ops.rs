//! MLX ops that mlx-rs 0.33 keeps crate-private (slice update, dynamic
//! zeros), called through mlx-c directly. Their error messages reach us
//! through a handler of our own: the runtime's patched libmlxc delivers each
//! error to every registered handler (docs/ARCHITECTURE.md).

use crate::{Array, Dtype, Result};

/// Runs one mlx-c call and turns its status into a `Result` with the
/// message MLX reported (`mlx_sys::checked`).
pub(crate) fn checked(op: &str, call: impl FnOnce() -> i32) -> Result<()> {
    mlx_sys::checked(op, call).map_err(crate::error)
}

/// Runs one mlx-c call that writes its result into `res`.
pub(crate) fn raw(op: &str, f: impl FnOnce(*mut mlx_sys::mlx_array) -> i32) -> Result<Array> {
    let res = mlx_sys::checked_array(op, f).map_err(crate::error)?;
    Ok(unsafe { Array::from_ptr(res) })
}

/// An mlx-c call that takes a vector of arrays and fills one (`call(out,
/// input)`): `args` in, the filled vector's arrays out; both vectors freed.
pub(crate) fn vector_call(
    op: &str,
    args: &[&Array],
    call: impl FnOnce(*mut mlx_sys::mlx_vector_array, mlx_sys::mlx_vector_array) -> i32,
) -> Result<Vec<Array>> {
    let handles: Vec<mlx_sys::mlx_array> = args.iter().map(|a| a.as_ptr()).collect();
    unsafe {
        let input = mlx_sys::mlx_vector_array_new_data(handles.as_ptr(), handles.len());
        let mut out = mlx_sys::mlx_vector_array_new();
        let applied = checked(op, || call(&mut out, input));
        mlx_sys::mlx_vector_array_free(input);
        let result = applied.and_then(|()| {
            (0..mlx_sys::mlx_vector_array_size(out))
                .map(|i| raw(op, |res| mlx_sys::mlx_vector_array_get(res, out, i)))
                .collect()
        });
        mlx_sys::mlx_vector_array_free(out);
        result
    }
}

/// The same stream mlx-rs ops use (thread-local override or the default).
fn stream() -> mlx_rs::Stream {
    mlx_rs::Stream::thread_local_or_default()
}

/// `a[start:stop]` along every axis (strides 1).
pub fn slice(a: &Array, start: &[i32], stop: &[i32]) -> Result<Array> {
    let strides = vec![1i32; start.len()];
    let s = stream();
    raw("slice", |res| unsafe {
        mlx_sys::mlx_slice(
            res,
            a.as_ptr(),
            start.as_ptr(),
            start.len(),
            stop.as_ptr(),
            stop.len(),
            strides.as_ptr(),
            strides.len(),
            s.as_ptr(),
        )
    })
}

/// `src` with `src[start:stop] = update` (MLX reuses `src`'s buffer when
/// nothing else holds it, so a cache written this way grows in place).
pub fn slice_update(src: &Array, update: &Array, start: &[i32], stop: &[i32]) -> Result<Array> {
    let strides = vec![1i32; start.len()];
    let s = stream();
    raw("slice_update", |res| unsafe {
        mlx_sys::mlx_slice_update(
            res,
            src.as_ptr(),
            update.as_ptr(),
            start.as_ptr(),
            start.len(),
            stop.as_ptr(),
            stop.len(),
            strides.as_ptr(),
            strides.len(),
            s.as_ptr(),
        )
    })
}

/// A float scalar in `dtype`, as MLX makes a Python scalar operand (weakly
/// typed: it takes the array's dtype, through float32).
pub fn scalar(v: f64, dtype: Dtype) -> Result<Array> {
    Array::from_f32(v as f32).as_dtype(dtype)
}

/// Zeros of a runtime dtype.
pub fn zeros(shape: &[i32], dtype: Dtype) -> Result<Array> {
    let s = stream();
    raw("zeros", |res| unsafe { mlx_sys::mlx_zeros(res, shape.as_ptr(), shape.len(), dtype.into(), s.as_ptr()) })
}

/// A Dtype from its mlx-c number (as carried by `plugin_api::Dtype`).
pub fn dtype_from_raw(raw: u32) -> Result<Dtype> {
    Dtype::try_from(raw).map_err(|_| crate::error(format!("unknown dtype number {raw}")))
}

/// Whether the default device is a GPU (where MLX sends some ops to
/// libraries with per-shape setup: `short_attention`, `depthwise_conv`);
/// also while `cuda_capture` records kernel launches.
pub fn on_gpu() -> bool {
    if crate::cuda_capture::capturing() {
        return true;
    }
    mlx_rs::Device::try_default()
        .ok()
        .and_then(|d| d.get_type().ok())
        .is_some_and(|t| matches!(t, mlx_rs::DeviceType::Gpu))
}

/// Bytes per element of `dtype`.
pub fn dtype_size(dtype: Dtype) -> usize {
    match dtype {
        Dtype::Bool | Dtype::Uint8 | Dtype::Int8 => 1,
        Dtype::Uint16 | Dtype::Int16 | Dtype::Float16 | Dtype::Bfloat16 => 2,
        Dtype::Uint32 | Dtype::Int32 | Dtype::Float32 => 4,
        Dtype::Uint64 | Dtype::Int64 | Dtype::Float64 | Dtype::Complex64 => 8,
    }
}

/// `a` laid out row-major in a buffer of its own when it is not already.
pub fn contiguous(a: &Array) -> Result<Array> {
    let s = stream();
    raw("contiguous", |res| unsafe { mlx_sys::mlx_contiguous(res, a.as_ptr(), false, s.as_ptr()) })
}
