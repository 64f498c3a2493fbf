//! Debian packages the build needs, installed by the project itself.

use crate::util::{output, run, step};
use anyhow::{bail, Result};
use std::process::Command;

/// cmake + ninja + g++ build libmlxc; libclang is bindgen's parser; patchelf
/// relinks the wheel's libmlx; OpenBLAS replaces its reference BLAS (~17x
/// faster f32 matmul, docs/benchmarks.md).
pub const PACKAGES: &[&str] = &["cmake", "ninja-build", "g++", "libclang-dev", "patchelf", "libopenblas0-pthread"];

/// Only the tests need these: the chat page is checked in a real headless
/// browser driven through its WebDriver.
pub const TEST_PACKAGES: &[&str] = &["chromium", "chromium-driver"];

fn installed(pkg: &str) -> bool {
    output(Command::new("dpkg-query").args(["-W", "-f=${Status}", pkg]))
        .map(|s| s.contains("install ok installed"))
        .unwrap_or(false)
}

pub fn ensure_packages() -> Result<()> {
    ensure(PACKAGES)
}

pub fn ensure_test_packages() -> Result<()> {
    ensure(TEST_PACKAGES)
}

fn ensure(packages: &[&str]) -> Result<()> {
    let missing: Vec<&str> = packages.iter().copied().filter(|p| !installed(p)).collect();
    if missing.is_empty() {
        step(format!("system packages present: {}", packages.join(" ")));
        return Ok(());
    }
    step(format!("installing system packages: {}", missing.join(" ")));
    let is_root = output(Command::new("id").arg("-u")).map(|s| s.trim() == "0").unwrap_or(false);
    if !is_root {
        bail!("missing packages {missing:?}: run `sudo apt-get install -y {}` and retry", missing.join(" "));
    }
    run(Command::new("apt-get").arg("update").arg("-qq"))?;
    run(Command::new("apt-get")
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive"))
}
