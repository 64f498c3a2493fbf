//! The root module every plugin exports (`#[export_root_module]`).
//!
//! Entries are optional by kind: a model family fills `plan_model` and
//! `open_model`, a cache layout `new_cache`, a drafter `detect_draft` and
//! `open_drafter`. New entries are appended after the last prefix field, so
//! a v1.0 plugin keeps loading in a v1.x host (missing entries read as None).

use crate::cache::{CacheBox, CacheSpec};
use crate::draft::{DrafterBox, DrafterOpenArgs, HostServicesBox};
use crate::error::PResult;
use crate::manifest::{HostInfo, PluginManifest};
use crate::model::{ModelBox, ModelOpenArgs, ModelPlan};
use abi_stable::library::RootModule;
use abi_stable::sabi_types::VersionStrings;
use abi_stable::std_types::RStr;
use abi_stable::{declare_root_module_statics, package_version_strings, StableAbi};

#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = PluginRoot_Ref)))]
#[sabi(missing_field(option))]
pub struct PluginRoot {
    /// The [`crate::ABI_VERSION`] this plugin was built against.
    pub abi_version: u32,
    /// Identity, claims and capabilities. Must agree with `plugin.toml`.
    pub manifest: extern "C" fn() -> PResult<PluginManifest>,
    /// Called once after the checks; a plugin may refuse the host here.
    pub init: extern "C" fn(host: &HostInfo) -> PResult<()>,
    /// Model families: per-layer cache needs from config.json, no weights read.
    pub plan_model: Option<extern "C" fn(config_json: RStr<'_>) -> PResult<ModelPlan>>,
    /// Model families: loads the weights of a model folder.
    pub open_model: Option<extern "C" fn(args: &ModelOpenArgs) -> PResult<ModelBox>>,
    /// Cache layouts: creates one layer's cache.
    pub new_cache: Option<extern "C" fn(spec: &CacheSpec) -> PResult<CacheBox>>,
    /// Drafters: how sure this plugin is that `dir` is its artifact (0 = not mine).
    pub detect_draft: Option<extern "C" fn(dir: RStr<'_>, config_json: RStr<'_>) -> u32>,
    /// Drafters: opens a drafter against the target the host lends.
    #[sabi(last_prefix_field)]
    pub open_drafter: Option<extern "C" fn(args: &DrafterOpenArgs, host: HostServicesBox) -> PResult<DrafterBox>>,
}

impl RootModule for PluginRoot_Ref {
    declare_root_module_statics! {PluginRoot_Ref}
    const BASE_NAME: &'static str = "mlx_engine_plugin";
    const NAME: &'static str = "mlx-engine plugin";
    const VERSION_STRINGS: VersionStrings = package_version_strings!();
}
