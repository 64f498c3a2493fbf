//! The stable ABI between the `host` and its plugins.
//!
//! Owns: every type that crosses a plugin boundary, the root module each
//! plugin exports, the explicit [`ABI_VERSION`], and the ownership rules for
//! MLX array handles ([`Tensor`], [`TensorRef`]). Does not own: any logic,
//! any MLX computation, I/O, or the host (no host crate depends on a plugin
//! and no plugin depends on a host crate).
//!
//! Three kinds of plugin implement it:
//! - a **model family** ([`ModelGraph`]): plans per-layer cache needs from a
//!   config before any weight is read, loads weights, runs forward passes;
//! - a **cache layout** ([`CacheLayout`]): stores K/V or recurrent state for one
//!   layer in one scheme, with trim, speculative rounds, state export/import
//!   and row operations for batching;
//! - a **draft provider** ([`Drafter`]): proposes tokens for speculative decoding.
//!
//! Versioning (the crate's semver is the ABI's version, and abi_stable
//! checks it when a library is loaded):
//! - **major** (and [`ABI_VERSION`]): any change to the layout of a struct
//!   or trait that crosses the boundary: a field or method inserted, removed,
//!   retyped or reordered. Plugins built against another major are refused,
//!   naming both versions.
//! - **minor**: an entry appended after `last_prefix_field` of a prefix type
//!   (the root module, a `#[sabi_trait]`) with a default, new capability
//!   tags, new constants. abi_stable still compares the whole layout at load,
//!   so a plugin built against an older minor is refused too: rebuild
//!   plugins against the host's plugin-api (docs/plugin-guide.md,
//!   Versioning).
//! - **patch**: documentation and code that crosses nothing.
//!
//! Open sets (kinds, error codes, capabilities) are strings or `u8`
//! newtypes, never exhaustive enums, so adding a member is no layout change.

// abi_stable's derives generate impls and names that trip these lints.
#![allow(non_local_definitions, non_camel_case_types)]

pub mod cache;
pub mod caps;
pub mod draft;
pub mod error;
pub mod layer_need;
pub mod manifest;
pub mod model;
pub mod root;
pub mod tensor;

pub use abi_stable;
pub use cache::*;
pub use draft::*;
pub use error::*;
pub use layer_need::*;
pub use manifest::*;
pub use model::*;
pub use root::*;
pub use tensor::*;

/// The explicit ABI generation. A host refuses a plugin whose manifest or
/// root module names another value, with both numbers in the message.
pub const ABI_VERSION: u32 = 2;
