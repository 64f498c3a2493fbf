//! `plugin.toml`: a plugin's identity, readable without loading its library.

use serde::Deserialize;
use std::path::Path;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TomlManifest {
    pub name: String,
    pub version: String,
    pub kind: String,
    pub abi_version: u32,
    /// The shared library's file name, beside this manifest.
    pub library: String,
}

impl TomlManifest {
    pub fn read(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let m: Self = toml::from_str(&text).map_err(|e| format!("invalid plugin.toml: {}", e.message()))?;
        if m.library.contains('/') || m.library.contains("..") {
            return Err(format!(
                "invalid plugin.toml: library `{}` must be a file name beside the manifest",
                m.library
            ));
        }
        Ok(m)
    }
}
