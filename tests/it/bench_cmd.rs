//! `host bench`: one row per batch size with its prefill and decode rates,
//! step time and peak memory, measured through the batch scheduler under the
//! buffer cache bound `host serve` would use.

use it::{host_bin, model, run_ok};

#[test]
fn bench_reports_every_batch_size() {
    let dir = model("tiny/tiny-llama-f32");
    let started = std::time::Instant::now();
    let out = run_ok(std::process::Command::new(host_bin()).current_dir(it::repo_root()).args([
        "bench",
        "--model",
        dir.to_str().unwrap(),
        "--prompt-len",
        "24",
        "--gen-len",
        "6",
        "--batch",
        "1,3",
        "--trials",
        "1",
        "--json",
        "--mlx-cache-limit",
        "0.25",
    ]));
    let wall = started.elapsed().as_secs_f64();
    let rows: serde_json::Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.iter().map(|r| r["batch"].as_u64().unwrap()).collect::<Vec<_>>(), [1, 3], "{out}");
    // The timed stretches are parts of the process's life: together they
    // fit in the wall time the command took.
    let timed: f64 = rows
        .iter()
        .map(|r| {
            let b = r["batch"].as_f64().unwrap();
            assert_eq!(r["prompt_tokens"].as_f64(), Some(24.0 * b), "{r}");
            24.0 * b / r["prefill_tokens_per_s"].as_f64().unwrap() + 5.0 * r["step_ms"].as_f64().unwrap() / 1e3
        })
        .sum();
    assert!(timed < wall, "the rows account for {timed:.3} s of a {wall:.3} s run: {out}");
    let weights: u64 = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "safetensors"))
        .map(|e| e.metadata().unwrap().len())
        .sum();
    for r in rows {
        for k in ["prefill_tokens_per_s", "decode_tokens_per_s", "step_ms"] {
            let v = r[k].as_f64().unwrap();
            assert!(v.is_finite() && v > 0.0, "{k} = {v}: {r}");
        }
        assert_eq!(r["mlx_cache_limit_bytes"].as_u64(), Some(1 << 28), "{r}");
        // The weights are live arrays while the batch runs.
        assert!(r["peak_memory_bytes"].as_u64().unwrap() >= weights / 2, "{r} (weights {weights} bytes)");
    }
}

/// `--model shape:FILE`: random weights of the shape a shape file describes
/// (its config.json and tensors), made once under the temporary folder and
/// benchmarked like a folder; a missing file is refused naming it.
#[test]
fn bench_runs_on_a_named_random_shape() {
    let bench = |model: &str| {
        std::process::Command::new(host_bin())
            .current_dir(it::repo_root())
            .args(["bench", "--model", model, "--prompt-len", "16", "--gen-len", "4", "--batch", "1,2"])
            .args(["--trials", "1", "--json"])
            .output()
            .unwrap()
    };
    let out = bench("shape:tests/bench/shapes/qwen3-tiny.json");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rows.as_array().map(Vec::len), Some(2), "{rows}");
    assert!(rows[1]["decode_tokens_per_s"].as_f64().unwrap() > 0.0, "{rows}");
    assert_eq!(rows[1]["prompt_tokens"].as_u64(), Some(32), "{rows}");
    // Without the flag, `host serve`'s default: 32 MiB on the CPU.
    assert_eq!(rows[1]["mlx_cache_limit_bytes"].as_u64(), Some(32 << 20), "{rows}");
    let dir = std::env::temp_dir().join("mlx-engine-shapes/qwen3-tiny");
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    assert_eq!((config["model_type"].as_str(), config["hidden_size"].as_u64()), (Some("qwen3"), Some(256)));
    let out = bench("shape:tests/bench/shapes/qwen3-70b.json");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("reading the shape file tests/bench/shapes/qwen3-70b.json"), "{err}");
}

/// `--ragged`: the rows' prompts run from `--prompt-len` down to about half
/// of it (a left-padded batch, decoded under padding masks), and the rates
/// count the tokens those prompts hold.
#[test]
fn ragged_rows_have_prompts_of_different_lengths() {
    let out = run_ok(std::process::Command::new(host_bin()).current_dir(it::repo_root()).args([
        "bench",
        "--model",
        "shape:tests/bench/shapes/qwen3-tiny.json",
        "--prompt-len",
        "16",
        "--gen-len",
        "4",
        "--batch",
        "4",
        "--trials",
        "1",
        "--json",
        "--ragged",
    ]));
    let rows: serde_json::Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    // 16, 14, 12 and 10 tokens.
    assert_eq!(rows[0]["prompt_tokens"].as_u64(), Some(52), "{rows}");
    assert!(rows[0]["decode_tokens_per_s"].as_f64().unwrap() > 0.0, "{rows}");
}
