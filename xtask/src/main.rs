//! Project automation, run as `cargo xtask <command>`.
//!
//! Every set-up step a fresh Linux machine needs lives here so that the
//! README's two commands are all a new user types: `cargo xtask serve` and
//! `cargo xtask test`. Each step is idempotent, cached under a stable prefix,
//! and prints what it does.

mod build;
mod cuda_check;
mod mlx;
mod models;
mod python;
mod system;
mod util;

use anyhow::{bail, Result};

const USAGE: &str = "usage: cargo xtask <command>

commands:
  setup        install system packages and prepare the shared MLX runtime (.mlx)
  build        setup, then build the workspace (release) and place plugin libraries
  models       build, then make the default model folder (and the oracle env)
  serve [ARGS] models, then run `host serve` on the default model (extra ARGS pass through)
  test  [ARGS] everything above plus the test models and cuda-check, then run the whole test suite
  cuda-check   lay out NVRTC and MLX's device headers for the CUDA kernel compile check (.cuda-check)
  gpu-pack     lay out the CUDA MLX runtime for the device machine (.gpu_a, .gpu_b)";

/// Errors end with one line and exit code 1: no backtrace (CI sets
/// RUST_BACKTRACE for the tests), so that a log's tail keeps the suite's
/// own summary of why tests failed.
fn main() -> std::process::ExitCode {
    util::started();
    match dispatch() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn dispatch() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let cmd = args.next().unwrap_or_default();
    let rest: Vec<String> = args.collect();
    let root = util::repo_root()?;
    std::env::set_current_dir(&root)?;
    match cmd.as_str() {
        "setup" => mlx::setup(&root).map(|_| ()),
        "build" => build::build(&root),
        "models" => models::default_model(&root),
        "serve" => models::serve(&root, &rest),
        "test" => models::test(&root, &rest),
        "gpu-pack" => mlx::gpu_pack(&root),
        "cuda-check" => cuda_check::setup(&root).map(|_| ()),
        "" | "help" | "-h" | "--help" => {
            println!("{USAGE}");
            Ok(())
        }
        other => bail!("unknown command `{other}`\n\n{USAGE}"),
    }
}
