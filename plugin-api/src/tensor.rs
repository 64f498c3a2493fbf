//! MLX array handles at the boundary, with ownership in the type, and
//! their dtypes (mlx-c's numbering).
//!
//! A handle is an `mlx_array` (a pointer to a reference-counted C++ array in
//! the process-wide libmlx). The rules, enforced by these two types:
//! - [`Tensor`] is OWNED. Passing one transfers it; the receiver frees it
//!   exactly once, which `Drop` does. `into_raw` gives up ownership (the
//!   caller must then free or re-wrap); `from_raw` takes it.
//! - [`TensorRef`] is BORROWED for a lifetime. It never frees. A callee that
//!   wants to keep the array beyond the call makes its own reference with
//!   [`TensorRef::to_owned`] (MLX arrays are immutable, so this is a cheap
//!   refcount bump, not a copy).
//! - Returned handles are always owned by the caller.

use abi_stable::StableAbi;
use std::ffi::c_void;
use std::marker::PhantomData;

/// An owned MLX array handle. Freed on drop.
#[repr(transparent)]
#[derive(StableAbi)]
pub struct Tensor {
    ctx: *mut c_void,
}

// MLX arrays are immutable and reference-counted with atomic counts; moving a
// handle between threads is how the engine hands work between tasks.
unsafe impl Send for Tensor {}
unsafe impl Sync for Tensor {}

impl Tensor {
    /// Takes ownership of a raw handle.
    ///
    /// # Safety
    /// `raw` must be a live handle that nobody else will free.
    pub unsafe fn from_raw(raw: mlx_sys::mlx_array) -> Self {
        Self { ctx: raw.ctx }
    }

    /// Gives up ownership; the caller must free the handle exactly once.
    pub fn into_raw(self) -> mlx_sys::mlx_array {
        let raw = mlx_sys::mlx_array { ctx: self.ctx };
        std::mem::forget(self);
        raw
    }

    /// The raw handle, still owned by `self`.
    pub fn as_raw(&self) -> mlx_sys::mlx_array {
        mlx_sys::mlx_array { ctx: self.ctx }
    }

    /// Borrows this tensor.
    pub fn borrow(&self) -> TensorRef<'_> {
        TensorRef { ctx: self.ctx, _life: PhantomData }
    }

    pub fn is_null(&self) -> bool {
        self.ctx.is_null()
    }
}

impl Drop for Tensor {
    fn drop(&mut self) {
        if !self.ctx.is_null() {
            unsafe { mlx_sys::mlx_array_free(mlx_sys::mlx_array { ctx: self.ctx }) };
        }
    }
}

/// A borrowed MLX array handle; never frees.
#[repr(transparent)]
#[derive(StableAbi, Clone, Copy)]
pub struct TensorRef<'a> {
    ctx: *mut c_void,
    _life: PhantomData<&'a Tensor>,
}

unsafe impl Send for TensorRef<'_> {}
unsafe impl Sync for TensorRef<'_> {}

impl<'a> TensorRef<'a> {
    /// Borrows a raw handle for `'a`.
    ///
    /// # Safety
    /// `raw` must stay alive for `'a`.
    pub unsafe fn from_raw(raw: mlx_sys::mlx_array) -> Self {
        Self { ctx: raw.ctx, _life: PhantomData }
    }

    pub fn as_raw(&self) -> mlx_sys::mlx_array {
        mlx_sys::mlx_array { ctx: self.ctx }
    }

    /// A new owned reference to the same (immutable) array.
    pub fn to_owned(&self) -> Tensor {
        let mut out = unsafe { mlx_sys::mlx_array_new() };
        unsafe { mlx_sys::mlx_array_set(&mut out, self.as_raw()) };
        Tensor { ctx: out.ctx }
    }
}

/// An MLX dtype, numbered as mlx-c's `mlx_dtype`.
#[repr(transparent)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dtype(pub u32);

impl Dtype {
    pub const BOOL: Self = Self(mlx_sys::mlx_dtype__MLX_BOOL);
    pub const INT32: Self = Self(mlx_sys::mlx_dtype__MLX_INT32);
    pub const UINT32: Self = Self(mlx_sys::mlx_dtype__MLX_UINT32);
    pub const FLOAT16: Self = Self(mlx_sys::mlx_dtype__MLX_FLOAT16);
    pub const FLOAT32: Self = Self(mlx_sys::mlx_dtype__MLX_FLOAT32);
    pub const BFLOAT16: Self = Self(mlx_sys::mlx_dtype__MLX_BFLOAT16);

    pub fn name(self) -> &'static str {
        match self {
            Self::FLOAT32 => "float32",
            Self::FLOAT16 => "float16",
            Self::BFLOAT16 => "bfloat16",
            Self::INT32 => "int32",
            Self::UINT32 => "uint32",
            Self::BOOL => "bool",
            _ => "other",
        }
    }
}
