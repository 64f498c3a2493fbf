//! Memory admission: a request that can never fit gets a 400 saying how
//! much it needs; one that fits alone but not beside running rows waits;
//! `host fit` prints the estimate and the largest context that fits.

use it::{host_bin, model, run_ok, Server};
use serde_json::json;

/// tiny-llama: 2 layers x 2 KV heads x (16 + 16) dims x 4 bytes.
const KV_PER_TOKEN: f64 = 512.0;
const GIB: f64 = (1u64 << 30) as f64;

#[test]
fn a_request_that_can_never_fit_is_refused_with_its_needs() {
    let budget = format!("{}", 100.0 * KV_PER_TOKEN / GIB); // room for ~100 tokens of KV
    let s = Server::start(&model("tiny/tiny-llama-f32"), &["--kv-budget", &budget]);
    let r = s.post("/v1/completions", &json!({ "prompt": [1, 2, 3], "max_tokens": 500, "temperature": 0 }));
    assert_eq!(r.status, 400, "{}", r.text());
    let e = r.json()["error"].clone();
    assert_eq!(e["code"], "insufficient_memory");
    let msg = e["message"].as_str().unwrap();
    assert!(msg.contains("needs") && msg.contains("GiB") && msg.contains("503 tokens"), "{msg}");
    let ok = s.post("/v1/completions", &json!({ "prompt": [1, 2, 3], "max_tokens": 20, "temperature": 0 }));
    assert_eq!(ok.status, 200, "{}", ok.text());
    let m = s.request("GET", "/metrics", &[], b"").text();
    assert!(m.lines().any(|l| l == "mlx_engine_admission_refusals_total 1"), "{m}");
}

/// A draft model's caches count: with tiny-llama drafting for itself the KV
/// per token doubles, so 63 tokens no longer fit a 100-token budget.
#[test]
fn a_draft_models_caches_count_against_the_kv_budget() {
    let budget = format!("{}", 100.0 * KV_PER_TOKEN / GIB);
    let m = model("tiny/tiny-llama-f32");
    let body = json!({ "prompt": [1, 2, 3], "max_tokens": 60, "temperature": 0 });
    let plain = Server::start(&m, &["--kv-budget", &budget]);
    assert_eq!(plain.post("/v1/completions", &body).status, 200);
    let self_dir = m.to_string_lossy().into_owned();
    let spec = Server::start(&m, &["--kv-budget", &budget, "--draft-model", &self_dir]);
    let r = spec.post("/v1/completions", &body);
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "insufficient_memory");
    let half = json!({ "prompt": [1, 2, 3], "max_tokens": 40, "temperature": 0 });
    assert_eq!(spec.post("/v1/completions", &half).status, 200, "43 tokens x 2 models fit 100 tokens");
}

#[test]
fn requests_that_fit_only_one_at_a_time_wait_instead_of_batching() {
    // Each request may reach 3 + 60 = 63 tokens; the budget holds 100.
    let budget = format!("{}", 100.0 * KV_PER_TOKEN / GIB);
    let bodies: Vec<_> =
        (0..3).map(|i| json!({ "prompt": [1, 2, 3 + i], "max_tokens": 60, "temperature": 0 })).collect();
    // All three are queued before the engine looks at any of them.
    let s =
        Server::start(&model("tiny/tiny-llama-f32"), &["--kv-budget", &budget, "--batch", "8", "--debug-endpoints"]);
    let statuses: Vec<u16> = s.burst("/v1/completions", &bodies).iter().map(|r| r.status).collect();
    assert_eq!(statuses, vec![200, 200, 200]);
    let st = s.stats();
    assert_eq!(st["max_batch_rows"], 1, "rows ran together beyond the KV budget: {st}");
    assert_eq!(st["completed"], 3);
    // Without the budget the same burst shares steps.
    let free = Server::start(&model("tiny/tiny-llama-f32"), &["--batch", "8", "--debug-endpoints"]);
    free.post_burst("/v1/completions", &bodies);
    assert_eq!(free.stats()["max_batch_rows"], 3);
}

#[test]
fn host_fit_prints_the_estimate_and_the_largest_context() {
    let d = model("tiny/tiny-llama-f32");
    let fit = |budget: &str| {
        run_ok(
            std::process::Command::new(host_bin())
                .current_dir(it::repo_root())
                .args(["fit", "--model"])
                .arg(&d)
                .args(["--ctx", "1000", "--memory-budget", budget]),
        )
    };
    let out = fit("1");
    assert!(out.contains("KV           512 bytes/token x 1000 tokens"), "{out}");
    assert!(out.contains("fits"), "{out}");
    let largest = |o: &str| -> u64 {
        o.lines()
            .find(|l| l.starts_with("largest context"))
            .unwrap()
            .split_whitespace()
            .nth(4)
            .unwrap()
            .parse()
            .unwrap()
    };
    let (small, big) = (largest(&fit("0.05")), largest(&fit("0.1")));
    assert!(big > small && small > 0, "{small} {big}");
    // The extra 0.05 GiB buys exactly that many tokens of KV.
    let per = (big - small) as f64 * KV_PER_TOKEN / (0.05 * GIB);
    assert!((per - 1.0).abs() < 0.01, "{per}");
    assert!(fit("0.0001").contains("does NOT fit"));
}
