//! The plugins in `--plugins`, discovered and checked against this host's
//! ABI, host and MLX versions.

use anyhow::Result;
use host_engine::runtime;
use host_loader::Registry;
use std::path::Path;

fn host_info() -> plugin_api::HostInfo {
    plugin_api::HostInfo {
        abi_version: plugin_api::ABI_VERSION,
        host_version: env!("CARGO_PKG_VERSION").into(),
        mlx_version: runtime::mlx_version().into(),
    }
}

pub fn registry(dir: &Path) -> Result<std::sync::Arc<Registry>> {
    Registry::discover(dir, &host_info()).map(std::sync::Arc::new).map_err(anyhow::Error::from)
}
