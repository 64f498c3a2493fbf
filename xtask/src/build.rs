//! Builds the workspace and puts each plugin library beside its manifest, so
//! `host serve --plugins ./plugins` finds it.

use crate::mlx;
use crate::util::{run, step};
use anyhow::{Context, Result};
use std::path::Path;
use std::process::Command;

pub fn build(root: &Path) -> Result<()> {
    mlx::setup(root)?;
    step("building the workspace (release)");
    run(Command::new("cargo").args(["build", "--release", "--workspace"]))?;
    place_plugins(root, &root.join("plugins"))?;
    place_plugins(root, &root.join("tests/fixtures"))?;
    Ok(())
}

/// Copies `target/release/lib<crate>.so` into every `<dir>/<plugin>/` that has a
/// `plugin.toml`, under the file name the manifest declares.
pub fn place_plugins(root: &Path, dir: &Path) -> Result<()> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Ok(()) };
    for e in entries {
        let folder = e?.path();
        let manifest = folder.join("plugin.toml");
        if !manifest.exists() {
            continue;
        }
        let text = std::fs::read_to_string(&manifest)?;
        let library = text
            .lines()
            .find_map(|l| {
                l.trim()
                    .strip_prefix("library")
                    .map(|r| r.trim_start_matches([' ', '=']).trim().trim_matches('"').to_string())
            })
            .with_context(|| format!("{}: no `library` key", manifest.display()))?;
        let built = root.join("target/release").join(&library);
        // Copy beside, then rename over: a host that has the old library
        // mapped keeps its (unlinked) file; writing in place would change
        // code under a running process.
        let dest = folder.join(&library);
        let tmp = folder.join(format!(".{library}.new"));
        std::fs::copy(&built, &tmp).with_context(|| format!("copying {} (is the crate a cdylib?)", built.display()))?;
        std::fs::rename(&tmp, &dest).with_context(|| format!("replacing {}", dest.display()))?;
    }
    step(format!("plugin libraries placed under {}", dir.strip_prefix(root).unwrap_or(dir).display()));
    Ok(())
}
