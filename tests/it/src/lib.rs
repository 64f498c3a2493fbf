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

/// The oracle environment's Python (mlx-lm), made by `cargo xtask test`.
pub fn python() -> PathBuf {
    let p = repo_root().join(".venv/bin/python");
    assert!(p.exists(), "{} is missing: run `cargo xtask test` (it creates the oracle environment)", p.display());
    p
}

/// A model folder under `models/`, which must exist.
pub fn model(rel: &str) -> PathBuf {
    let p = repo_root().join("models").join(rel);
    assert!(p.join("config.json").exists(), "{} is missing: run `cargo xtask test` (it makes the model folders)", p.display());
    p
}

/// Runs a command and returns its stdout, failing the test with stderr.
pub fn run_ok(cmd: &mut std::process::Command) -> String {
    let out = cmd.output().expect("spawn");
    assert!(out.status.success(), "{:?} failed:\n{}", cmd, String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("utf-8 stdout")
}

/// A fresh scratch folder under target/ (removed when dropped).
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Self {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = profile_dir().join("scratch").join(format!("{tag}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::SeqCst)));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("scratch dir");
        Self(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
