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
    let (passed, failed) = run_counting(Command::new("cargo").args(["test", "--release", "--workspace", "--no-fail-fast"]).args(extra))?;
    // One closing line for the whole suite, after cargo's per-binary lines
    // (the last of which is often an empty doc-test run).
    println!("total: {passed} passed, {failed} failed");
    if failed > 0 || passed == 0 {
        anyhow::bail!("the test suite did not pass ({passed} passed, {failed} failed)");
    }
    Ok(())
}

/// Runs a cargo test command, echoing its output, and sums its
/// `test result:` lines.
fn run_counting(cmd: &mut Command) -> Result<(usize, usize)> {
    use std::io::{BufRead, BufReader};
    let mut child = cmd.stdout(std::process::Stdio::piped()).spawn()?;
    let (mut passed, mut failed) = (0, 0);
    for line in BufReader::new(child.stdout.take().expect("piped")).lines() {
        let line = line?;
        println!("{line}");
        if let Some(rest) = line.strip_prefix("test result: ") {
            for part in rest.split(';') {
                let mut words = part.split_whitespace().rev();
                let (Some(label), Some(n)) = (words.next(), words.next()) else { continue };
                let n: usize = n.parse().unwrap_or(0);
                match label {
                    "passed" => passed += n,
                    "failed" => failed += n,
                    _ => {}
                }
            }
        }
    }
    let status = child.wait()?;
    if !status.success() && failed == 0 {
        anyhow::bail!("cargo test failed with {status}");
    }
    Ok((passed, failed))
}
