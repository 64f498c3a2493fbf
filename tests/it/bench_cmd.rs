//! `host bench`: one row per batch size with its prefill and decode rates,
//! step time and peak memory, measured through the batch scheduler.

use it::{host_bin, model, run_ok};

#[test]
fn bench_reports_every_batch_size() {
    let dir = model("tiny/tiny-llama-f32");
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
    ]));
    let rows: serde_json::Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.iter().map(|r| r["batch"].as_u64().unwrap()).collect::<Vec<_>>(), [1, 3], "{out}");
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
        // The weights are live arrays while the batch runs.
        assert!(r["peak_memory_bytes"].as_u64().unwrap() >= weights / 2, "{r} (weights {weights} bytes)");
    }
}
