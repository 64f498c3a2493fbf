//! Raw bindings to mlx-c, linked against the process-wide shared `libmlxc.so`
//! and `libmlx.so`.
//!
//! Owns: the generated FFI surface, and the few items mlx-rs 0.33 expects from
//! the published (macOS-only) mlx-sys. Does not own: any safe wrapper (that is
//! mlx-rs) or the runtime build (that is `cargo xtask setup`).
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
