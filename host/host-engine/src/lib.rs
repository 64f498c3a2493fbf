//! The generation core of the host.
//!
//! Owns: the process's view of the MLX runtime, and (as the product grows)
//! sampling, the decode loop, batching and speculation. Does not own: HTTP
//! (host-server), plugin discovery (host-loader) or any model family.

pub mod probe;
pub mod runtime;
