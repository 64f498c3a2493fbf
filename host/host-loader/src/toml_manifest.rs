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

/// Why a `plugin.toml` was not accepted.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("cannot read {path}: {error}")]
    Read { path: String, error: std::io::Error },
    #[error("invalid plugin.toml: {0}")]
    Invalid(String),
}

impl TomlManifest {
    pub fn read(path: &Path) -> Result<Self, ManifestError> {
        let text = std::fs::read_to_string(path)
            .map_err(|error| ManifestError::Read { path: path.display().to_string(), error })?;
        let m: Self = toml::from_str(&text).map_err(|e| ManifestError::Invalid(e.message().to_owned()))?;
        if m.library.contains('/') || m.library.contains("..") {
            return Err(ManifestError::Invalid(format!(
                "library `{}` must be a file name beside the manifest",
                m.library
            )));
        }
        Ok(m)
    }
}
