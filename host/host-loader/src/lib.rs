//! The host's side of the plugin boundary.
//!
//! Owns: scanning a plugins folder, reading each `plugin.toml` without
//! running plugin code, loading and checking libraries (abi_stable layout
//! check, ABI version, identity), the table of what each plugin claims and
//! can do, and composing a model graph with cache layouts by capability.
//! Never: HTTP, scheduling, or the name of a model family (a test asserts
//! that no host source names one).

pub mod compose;
pub mod drafters;
pub mod registry;
pub mod services;
pub mod toml_manifest;

pub use compose::{ComposeError, ComposedModel};
pub use registry::{DiscoverError, LoadedPlugin, Refusal, Registry};
