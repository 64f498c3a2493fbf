//! The user-facing entry points: `serve` and `test`.

use crate::{build, python};
use crate::util::{run, step};
use anyhow::Result;
use std::path::Path;
use std::process::Command;

pub fn default_model(root: &Path) -> Result<()> {
    build::build(root)
}

/// Builds everything and runs the product's main job.
pub fn serve(root: &Path, extra: &[String]) -> Result<()> {
    default_model(root)?;
    let host = root.join("target/release/host");
    run(Command::new(&host).arg("--version").args(extra))?;
    Ok(())
}

/// Builds everything, prepares the oracle environment and runs the suite.
pub fn test(root: &Path, extra: &[String]) -> Result<()> {
    build::build(root)?;
    python::venv(root)?;
    step("running the test suite");
    run(Command::new("cargo").args(["test", "--release", "--workspace"]).args(extra))
}
