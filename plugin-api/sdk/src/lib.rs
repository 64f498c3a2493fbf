//! Author-side helpers for writing a plugin against `plugin-api`.
//!
//! Owns: [`export_plugin!`] (the root module and its guarded `extern "C"`
//! entries), [`guard`] and [`quietly`] (no panic crosses the boundary), conversions between
//! boundary [`Tensor`]s and mlx-rs [`Array`]s that respect the ownership
//! rules, [`Locked`] (a graph holding MLX arrays made `Sync` without
//! `unsafe`), [`shared`] weights across instances, manifest helpers, and
//! [`draft_sampling`] (drafters drawing drafts as the host samples),
//! [`kv_need`] (what every cache layout checks of an update, and the mask of
//! unpadded rows). Never
//! depends on a host crate.

pub mod draft_sampling;
pub mod kv_need;
mod locked;
pub mod shared;

pub use locked::Locked;
pub use mlx_rs;
pub use plugin_api;

use mlx_rs::Array;
use plugin_api::abi_stable::std_types::{RResult, RString, RVec};
use plugin_api::{ErrorCode, PResult, PluginError, Tensor, TensorRef};
use std::mem::ManuallyDrop;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Runs `f`, turning a panic into `ErrorCode::PANIC` and the result into an
/// `RResult`. Wrap the body of every boundary method in it: abi_stable's
/// trait-object vtables abort the process on unwind.
pub fn guard<T>(f: impl FnOnce() -> Result<T, PluginError>) -> PResult<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => RResult::ROk(v),
        Ok(Err(e)) => RResult::RErr(e),
        Err(payload) => RResult::RErr(PluginError::new(ErrorCode::PANIC, panic_message(&payload))),
    }
}

/// Runs the body of a boundary method that returns no `PResult`
/// (`CacheLayout::offset`, `trim`, ...) under [`guard`]: a panic cannot
/// unwind through the vtable (which would abort the host); the method
/// answers `fallback` instead.
pub fn quietly<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    guard(|| Ok(f())).into_result().unwrap_or(fallback)
}

/// [`guard`] for a body that speaks mlx-rs errors.
pub fn guard_mlx<T>(f: impl FnOnce() -> Result<T, mlx_rs::error::Exception>) -> PResult<T> {
    guard(|| f().map_err(mlx_error))
}

fn panic_message(payload: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        format!("plugin panicked: {s}")
    } else if let Some(s) = payload.downcast_ref::<String>() {
        format!("plugin panicked: {s}")
    } else {
        "plugin panicked".to_owned()
    }
}

/// An MLX exception as a boundary error (MLX's own message).
pub fn mlx_error(e: mlx_rs::error::Exception) -> PluginError {
    PluginError::mlx(e.what().to_owned())
}

/// Takes ownership of a boundary tensor as an mlx-rs array.
pub fn into_array(t: Tensor) -> Array {
    unsafe { Array::from_ptr(t.into_raw()) }
}

/// Hands an mlx-rs array across the boundary (ownership transferred).
pub fn into_tensor(a: Array) -> Tensor {
    let raw = a.as_ptr();
    std::mem::forget(a);
    unsafe { Tensor::from_raw(raw) }
}

/// Lends `a` across the boundary for one call (nothing changes hands: the
/// array outlives the call).
pub fn lend(a: &Array) -> TensorRef<'_> {
    unsafe { TensorRef::from_raw(a.as_ptr()) }
}

/// A borrowed view of a boundary tensor as an mlx-rs array. Never frees: the
/// `ManuallyDrop` keeps the borrow's owner responsible.
pub fn view(t: TensorRef<'_>) -> ManuallyDrop<Array> {
    ManuallyDrop::new(unsafe { Array::from_ptr(t.as_raw()) })
}

/// A new owned mlx-rs reference to a borrowed tensor (cheap: refcount).
pub fn to_array(t: TensorRef<'_>) -> Array {
    into_array(t.to_owned())
}

/// `RVec<RString>` from string slices.
pub fn rstrings(items: &[&str]) -> RVec<RString> {
    items.iter().map(|s| RString::from(*s)).collect()
}

/// A manifest whose identity comes from the plugin crate itself: the name is
/// the package name and the version its package version (which is what
/// `plugin.toml` must say), and the ABI version is the one compiled in.
///
/// ```ignore
/// plugin_sdk::manifest!(PluginKind::CACHE_LAYOUT, "what it is", claims, &[caps::TRIM])
/// ```
#[macro_export]
macro_rules! manifest {
    ($kind:expr, $description:expr, $claims:expr, $caps:expr $(,)?) => {
        $crate::plugin_api::PluginManifest {
            name: env!("CARGO_PKG_NAME").into(),
            version: env!("CARGO_PKG_VERSION").into(),
            abi_version: $crate::plugin_api::ABI_VERSION,
            kind: $kind,
            description: $description.into(),
            claims: $claims,
            capabilities: $crate::rstrings($caps),
            extra: ::core::default::Default::default(),
        }
    };
}

/// Builds the `PluginRoot` and its guarded `extern "C"` entries. The
/// plugin crate must depend on `abi_stable` directly: its export attribute
/// names the crate by its absolute path.
///
/// ```ignore
/// plugin_sdk::export_plugin! {
///     manifest: manifest,            // fn() -> PluginManifest
///     plan_model: plan,              // fn(&str) -> Result<ModelPlan, PluginError>
///     open_model: open,              // fn(&ModelOpenArgs) -> Result<ModelBox, PluginError>
/// }
/// ```
/// Optional entries, in this order: `init` (fn(&HostInfo) -> Result<(), _>),
/// `plan_model`, `open_model`, `new_cache` (fn(&CacheSpec) -> Result<CacheBox, _>),
/// `detect_draft` (fn(&str, &str) -> u32), `open_drafter`
/// (fn(&DrafterOpenArgs, HostServicesBox) -> Result<DrafterBox, _>).
#[macro_export]
macro_rules! export_plugin {
    (
        manifest: $manifest:ident
        $(, init: $init:ident)?
        $(, plan_model: $plan:ident)?
        $(, open_model: $open:ident)?
        $(, new_cache: $cache:ident)?
        $(, detect_draft: $detect:ident)?
        $(, open_drafter: $drafter:ident)?
        $(,)?
    ) => {
        extern "C" fn __export_manifest() -> $crate::plugin_api::PResult<$crate::plugin_api::PluginManifest> {
            $crate::guard(|| Ok($manifest()))
        }
        extern "C" fn __export_init(host: &$crate::plugin_api::HostInfo) -> $crate::plugin_api::PResult<()> {
            #[allow(unused_variables)]
            let host = host;
            $crate::guard(|| { $( return $init(host); )? #[allow(unreachable_code)] Ok(()) })
        }
        $( extern "C" fn __export_plan_model(
            config: $crate::plugin_api::abi_stable::std_types::RStr<'_>,
        ) -> $crate::plugin_api::PResult<$crate::plugin_api::ModelPlan> {
            $crate::guard(|| $plan(config.as_str()))
        } )?
        $( extern "C" fn __export_open_model(
            args: &$crate::plugin_api::ModelOpenArgs,
        ) -> $crate::plugin_api::PResult<$crate::plugin_api::ModelBox> {
            $crate::guard(|| $open(args))
        } )?
        $( extern "C" fn __export_new_cache(
            spec: &$crate::plugin_api::CacheSpec,
        ) -> $crate::plugin_api::PResult<$crate::plugin_api::CacheBox> {
            $crate::guard(|| $cache(spec))
        } )?
        $( extern "C" fn __export_detect_draft(
            dir: $crate::plugin_api::abi_stable::std_types::RStr<'_>,
            config: $crate::plugin_api::abi_stable::std_types::RStr<'_>,
        ) -> u32 {
            ::std::panic::catch_unwind(|| $detect(dir.as_str(), config.as_str())).unwrap_or(0)
        } )?
        $( extern "C" fn __export_open_drafter(
            args: &$crate::plugin_api::DrafterOpenArgs,
            host: $crate::plugin_api::HostServicesBox,
        ) -> $crate::plugin_api::PResult<$crate::plugin_api::DrafterBox> {
            $crate::guard(move || $drafter(args, host))
        } )?

        /// The plugin's root module (checked by the host's loader).
        #[::abi_stable::export_root_module]
        pub fn __plugin_root() -> $crate::plugin_api::PluginRoot_Ref {
            use $crate::plugin_api::abi_stable::prefix_type::PrefixTypeTrait;
            $crate::plugin_api::PluginRoot {
                abi_version: $crate::plugin_api::ABI_VERSION,
                manifest: __export_manifest,
                init: __export_init,
                plan_model: $crate::__opt!($( __export_plan_model, $plan )?),
                open_model: $crate::__opt!($( __export_open_model, $open )?),
                new_cache: $crate::__opt!($( __export_new_cache, $cache )?),
                detect_draft: $crate::__opt!($( __export_detect_draft, $detect )?),
                open_drafter: $crate::__opt!($( __export_open_drafter, $drafter )?),
            }
            .leak_into_prefix()
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __opt {
    () => {
        None
    };
    ($f:ident, $unused:ident) => {
        Some($f)
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_an_error_or_the_fallback_never_an_unwind() {
        let e = guard::<u32>(|| panic!("boom")).into_result().unwrap_err();
        assert_eq!(e.code, ErrorCode::PANIC);
        assert!(e.message.contains("boom"), "{}", e.message);
        assert_eq!(quietly(7u64, || panic!("boom")), 7);
        assert_eq!(quietly(7u64, || 3), 3);
    }
}
