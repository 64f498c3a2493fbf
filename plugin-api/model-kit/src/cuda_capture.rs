//! Running the call paths of our CUDA kernels without a GPU. While
//! [`launches`] runs a closure, [`crate::ops::on_gpu`] answers true, a
//! kernel is described instead of handed to MLX, and each launch records the
//! source MLX would compile for it, then returns zeros of its outputs'
//! shapes, so what the caller does after the launch runs as on a device.
//! The compile check (`kernel_check`) hands what was recorded to NVRTC: the
//! template values, dtypes and input names are the ones the engine's own
//! code chose, not a copy of them kept beside it.

use crate::Result;
use std::cell::RefCell;

/// One launch as MLX would compile it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launched {
    /// The name the kernel was made under (`CudaKernel::new`).
    pub kernel: String,
    /// The `__global__` function's name (one per set of template values).
    pub function: String,
    /// Its inputs' C++ types, comma-separated (the name does not carry them).
    pub input_types: String,
    /// The whole translation unit.
    pub source: String,
    /// The launch's threads in all and per block, per axis (MLX's `grid`
    /// and `threadgroup`).
    pub grid: [i32; 3],
    pub threads: [i32; 3],
}

thread_local! {
    static RECORDED: RefCell<Option<Vec<Launched>>> = const { RefCell::new(None) };
}

/// Whether this thread is recording launches instead of running them.
pub fn capturing() -> bool {
    RECORDED.with(|r| r.borrow().is_some())
}

pub(crate) fn record(launched: Launched) {
    RECORDED.with(|r| {
        if let Some(v) = r.borrow_mut().as_mut() {
            v.push(launched);
        }
    });
}

/// Runs `f` with launches recorded, not run: every launch `f` made, in
/// order. The outputs `f` computes are zeros where a kernel wrote them.
pub fn launches<T>(f: impl FnOnce() -> Result<T>) -> Result<Vec<Launched>> {
    struct Stop;
    impl Drop for Stop {
        fn drop(&mut self) {
            RECORDED.with(|r| r.borrow_mut().take());
        }
    }
    RECORDED.with(|r| *r.borrow_mut() = Some(Vec::new()));
    let stop = Stop;
    f()?;
    let recorded = RECORDED.with(|r| r.borrow_mut().take()).unwrap_or_default();
    drop(stop);
    Ok(recorded)
}

impl Launched {
    /// Threads per block.
    pub fn block_threads(&self) -> i32 {
        self.threads.iter().product()
    }
}
