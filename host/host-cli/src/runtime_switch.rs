//! Selecting another MLX runtime (the CUDA wheel's libmlx) without a rebuild.
//!
//! Every binary and plugin links `libmlx.so`/`libmlxc.so` by name with a
//! RUNPATH to `.mlx/lib`. LD_LIBRARY_PATH is searched before RUNPATH, so
//! pointing it at another folder that holds a `libmlx.so` (and `libmlxc.so`,
//! or relying on the one in `.mlx/lib`) switches the runtime for the whole
//! process, plugins included. The library is mapped before `main` runs, so
//! the switch re-executes the binary once with the variable set.

use anyhow::{Context, Result};
use std::os::unix::process::CommandExt;

const ENV: &str = "MLX_ENGINE_LIB_DIR";
const DONE: &str = "MLX_ENGINE_LIB_DIR_APPLIED";

/// Reads `--mlx-lib DIR` (or MLX_ENGINE_LIB_DIR) and, if the loader has not
/// been told yet, re-executes with LD_LIBRARY_PATH=DIR first.
pub fn apply() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let from_flag = args.iter().enumerate().find_map(|(i, a)| {
        a.strip_prefix("--mlx-lib=")
            .map(str::to_owned)
            .or_else(|| (a == "--mlx-lib").then(|| args.get(i + 1).cloned()).flatten())
    });
    let Some(dir) = from_flag.or_else(|| std::env::var(ENV).ok()).filter(|d| !d.is_empty()) else {
        return Ok(());
    };
    if std::env::var(DONE).as_deref() == Ok(dir.as_str()) {
        return Ok(());
    }
    let old = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
    let path = if old.is_empty() { dir.clone() } else { format!("{dir}:{old}") };
    let exe = std::env::current_exe().context("locating the host binary")?;
    let err = std::process::Command::new(exe).args(&args[1..]).env("LD_LIBRARY_PATH", path).env(DONE, &dir).exec();
    Err(err).context("re-executing with the selected MLX runtime")
}
