//! `PluginRoot` with a changed layout: `build_flags` inserted before
//! `manifest`, every other field as in plugin-api 1.0 (same prefix-type
//! attributes, same name, same root-module constants).

#![allow(non_local_definitions, non_camel_case_types)]

use abi_stable::library::RootModule;
use abi_stable::sabi_types::VersionStrings;
use abi_stable::std_types::RStr;
use abi_stable::{declare_root_module_statics, StableAbi};
use real_api::*;

#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = PluginRoot_Ref)))]
#[sabi(missing_field(option))]
pub struct PluginRoot {
    pub abi_version: u32,
    /// Not in plugin-api: shifts every later field.
    pub build_flags: u64,
    pub manifest: extern "C" fn() -> PResult<PluginManifest>,
    pub init: extern "C" fn(host: &HostInfo) -> PResult<()>,
    pub plan_model: Option<extern "C" fn(config_json: RStr<'_>) -> PResult<ModelPlan>>,
    pub open_model: Option<extern "C" fn(args: &ModelOpenArgs) -> PResult<ModelBox>>,
    pub new_cache: Option<extern "C" fn(spec: &CacheSpec) -> PResult<CacheBox>>,
    pub detect_draft: Option<extern "C" fn(dir: RStr<'_>, config_json: RStr<'_>) -> u32>,
    #[sabi(last_prefix_field)]
    pub open_drafter: Option<extern "C" fn(args: &DrafterOpenArgs, host: HostServicesBox) -> PResult<DrafterBox>>,
}

impl RootModule for PluginRoot_Ref {
    declare_root_module_statics! {PluginRoot_Ref}
    const BASE_NAME: &'static str = "mlx_engine_plugin";
    const NAME: &'static str = "mlx-engine plugin";
    // The real plugin-api's version: the library version check passes, so
    // only the layout check can refuse this root module.
    const VERSION_STRINGS: VersionStrings = <real_api::PluginRoot_Ref as RootModule>::VERSION_STRINGS;
}
