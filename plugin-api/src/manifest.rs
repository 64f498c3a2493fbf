//! What a plugin says about itself: identity, what it claims, what it can do.
//!
//! The same identity is written in a small `plugin.toml` beside the shared
//! library (readable without running plugin code); the host checks that the
//! two agree before it uses the plugin.

use abi_stable::std_types::{RString, RVec, Tuple2};
use abi_stable::StableAbi;

/// An open set of plugin kinds (a `u8`, so v1.x may add kinds).
#[repr(transparent)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PluginKind(pub u8);

impl PluginKind {
    pub const MODEL_FAMILY: Self = Self(1);
    pub const CACHE_LAYOUT: Self = Self(2);
    pub const DRAFTER: Self = Self(3);

    /// The spelling used in `plugin.toml` and `host plugins`.
    pub fn as_str(self) -> &'static str {
        match self.0 {
            1 => "model-family",
            2 => "cache-layout",
            3 => "drafter",
            _ => "unknown",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "model-family" => Some(Self::MODEL_FAMILY),
            "cache-layout" => Some(Self::CACHE_LAYOUT),
            "drafter" => Some(Self::DRAFTER),
            _ => None,
        }
    }
}

/// The strings by which the host finds a plugin for a job.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Default)]
pub struct Claims {
    /// Model families: HF `model_type` values (and aliases) this graph serves.
    pub model_types: RVec<RString>,
    /// Model families: HF `architectures` entries this graph serves.
    pub architectures: RVec<RString>,
    /// Drafters: the draft kinds implemented (`ngram`, `two-model`, `mtp`, ...).
    pub draft_kinds: RVec<RString>,
    /// Cache layouts: the layer needs served (`full`, `sliding`, `recurrent`).
    pub cache_needs: RVec<RString>,
    /// Cache layouts: the storage schemes implemented (`plain`, `affine4`, ...).
    pub cache_schemes: RVec<RString>,
}

#[repr(C)]
#[derive(StableAbi, Debug, Clone)]
pub struct PluginManifest {
    pub name: RString,
    pub version: RString,
    /// The [`crate::ABI_VERSION`] the plugin was built against.
    pub abi_version: u32,
    pub kind: PluginKind,
    pub description: RString,
    pub claims: Claims,
    /// Capability tags (see [`crate::caps`]).
    pub capabilities: RVec<RString>,
    /// Free-form key/value extension for fields added in v1.x.
    pub extra: RVec<Tuple2<RString, RString>>,
}

/// What the host tells a plugin at `init`.
#[repr(C)]
#[derive(StableAbi, Debug, Clone)]
pub struct HostInfo {
    pub abi_version: u32,
    pub host_version: RString,
    pub mlx_version: RString,
}
