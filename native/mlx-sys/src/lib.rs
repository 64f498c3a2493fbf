//! Raw bindings to mlx-c, linked against the process-wide shared `libmlxc.so`
//! and `libmlx.so`.
//!
//! Owns: the generated FFI surface, the few items mlx-rs 0.33 expects from
//! the published (macOS-only) mlx-sys, and [`checked`] (a call's status with
//! MLX's own message) for crates that call mlx-c directly. Does not own: any
//! safe wrapper (that is mlx-rs) or the runtime build (that is `cargo xtask
//! setup`).
#![allow(non_upper_case_globals)]
#![allow(non_camel_case_types)]
#![allow(non_snake_case)]
#![allow(clippy::all)]
#![allow(rustdoc::all)]

/// IEEE half as 16 bits of storage; mlx-rs reads it through `.0`.
#[repr(transparent)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct float16_t(pub u16);

/// bfloat16 as 16 bits of storage; mlx-rs reads it with `bf16::from_bits`.
pub type bfloat16_t = u16;

include!(concat!(env!("OUT_DIR"), "/bindings.rs"));

/// mlx-rs seeds its default random key from this Apple clock. Off Apple we
/// give it a monotonic nanosecond count with the same role.
#[no_mangle]
pub extern "C" fn mach_approximate_time() -> u64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}

thread_local! {
    static LAST_ERROR: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

extern "C" fn remember_error(msg: *const std::ffi::c_char, _data: *mut std::ffi::c_void) {
    let text = unsafe { std::ffi::CStr::from_ptr(msg) }.to_string_lossy().into_owned();
    LAST_ERROR.with(|e| *e.borrow_mut() = Some(text));
}

static HANDLER: std::sync::Once = std::sync::Once::new();

/// Runs one mlx-c call and turns its status into a `Result` carrying the
/// message MLX reported. The handler that keeps the message is registered
/// before the first call (each library linking this crate registers its
/// own; the runtime's patched libmlxc delivers every error to each one).
pub fn checked(op: &str, call: impl FnOnce() -> i32) -> Result<(), String> {
    HANDLER.call_once(|| unsafe { mlx_set_error_handler(Some(remember_error), std::ptr::null_mut(), None) });
    let status = call();
    if status == 0 {
        return Ok(());
    }
    Err(LAST_ERROR.with(|e| e.borrow_mut().take()).unwrap_or_else(|| format!("{op} failed with status {status}")))
}

/// [`checked`] for a call that writes a new array into its first argument:
/// the array on success, freed on failure.
pub fn checked_array(op: &str, f: impl FnOnce(*mut mlx_array) -> i32) -> Result<mlx_array, String> {
    let mut res = unsafe { mlx_array_new() };
    match checked(op, || f(&mut res)) {
        Ok(()) => Ok(res),
        Err(e) => {
            unsafe { mlx_array_free(res) };
            Err(e)
        }
    }
}
