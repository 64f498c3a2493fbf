//! Small process and filesystem helpers shared by the set-up steps.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The repository root: xtask always lives one level below it.
pub fn repo_root() -> Result<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    Ok(dir.parent().context("xtask has a parent folder")?.to_path_buf())
}

/// Where built native libraries and downloads are cached across clones and CI
/// runs on the same machine (so a rebuild is skipped when nothing changed).
pub fn cache_dir() -> PathBuf {
    if let Some(p) = std::env::var_os("MLX_ENGINE_CACHE") {
        return PathBuf::from(p);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/tmp".into())).join(".cache"));
    base.join("mlx-engine")
}

/// A step's line, with the time since xtask started: a CI log then says
/// where its minutes went (builds, set-up, the suite).
pub fn step(msg: impl AsRef<str>) {
    let s = started().elapsed().as_secs();
    println!("==> [{}m{:02}s] {}", s / 60, s % 60, msg.as_ref());
}

/// When xtask started (its first call: `main` makes it).
pub fn started() -> std::time::Instant {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    *START.get_or_init(std::time::Instant::now)
}

/// Runs a command, echoing it, and fails with its exit status.
pub fn run(cmd: &mut Command) -> Result<()> {
    println!("    $ {}", show(cmd));
    let status = cmd.status().with_context(|| format!("starting {}", show(cmd)))?;
    if !status.success() {
        bail!("`{}` failed with {status}", show(cmd));
    }
    Ok(())
}

/// Runs a command quietly and returns its stdout.
pub fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("starting {}", show(cmd)))?;
    if !out.status.success() {
        bail!("`{}` failed: {}", show(cmd), String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8(out.stdout)?)
}

fn show(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// FNV-1a over byte slices: a stable cache key with no extra dependency.
pub fn fnv(parts: &[&[u8]]) -> String {
    let mut h: u64 = 0xcbf29ce484222325;
    for p in parts {
        for b in p.iter().chain([0u8].iter()) {
            h ^= *b as u64;
            h = h.wrapping_mul(0x100000001b3);
        }
    }
    format!("{h:016x}")
}

/// Points `link` at `target`, replacing an older link.
pub fn symlink(target: &Path, link: &Path) -> Result<()> {
    if link.symlink_metadata().is_ok() {
        std::fs::remove_file(link).with_context(|| format!("removing {}", link.display()))?;
    }
    std::os::unix::fs::symlink(target, link).with_context(|| format!("linking {}", link.display()))
}

pub fn copy_dir(src: &Path, dst: &Path) -> Result<()> {
    std::fs::create_dir_all(dst)?;
    for e in std::fs::read_dir(src)? {
        let e = e?;
        let to = dst.join(e.file_name());
        if e.file_type()?.is_dir() {
            copy_dir(&e.path(), &to)?;
        } else {
            std::fs::copy(e.path(), &to)?;
        }
    }
    Ok(())
}
