//! Helpers shared by the end-to-end tests: where the build put things.

use std::path::PathBuf;

/// The repository root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("repo root")
}

/// The cargo profile folder this test binary was built into
/// (`target/<profile>`), which also holds the workspace's cdylibs and binaries.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test exe");
    exe.parent().and_then(|deps| deps.parent()).expect("target/<profile>").to_path_buf()
}

/// A workspace cdylib by crate name, e.g. `proof_maker` → `libproof_maker.so`.
pub fn cdylib(name: &str) -> PathBuf {
    let p = profile_dir().join(format!("lib{name}.so"));
    assert!(p.exists(), "{} is missing: run `cargo xtask build` (or the README's test command)", p.display());
    p
}

/// The `host` binary of the same profile.
pub fn host_bin() -> PathBuf {
    let p = profile_dir().join("host");
    assert!(p.exists(), "{} is missing: run `cargo xtask build`", p.display());
    p
}
