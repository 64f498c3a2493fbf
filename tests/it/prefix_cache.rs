//! The prefix cache: a multi-turn chat re-prefills only the new turn
//! (`cached_tokens` says how much was reused) and the output is identical
//! to a cold run; /metrics reports it in Prometheus format.

use it::{model, Server};
use serde_json::{json, Value};

fn turn(s: &Server, msgs: &Value) -> Value {
    let r = s.post("/v1/chat/completions", &json!({ "messages": msgs, "temperature": 0, "max_tokens": 24 }));
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

/// Three turns of one conversation; returns (answers, cached tokens per turn).
fn conversation(s: &Server) -> (Vec<String>, Vec<u64>) {
    let mut msgs = vec![json!({ "role": "user", "content": "Name a fruit." })];
    let mut answers = Vec::new();
    let mut cached = Vec::new();
    for next in ["And a vegetable?", "And a colour?", ""] {
        let r = turn(s, &Value::Array(msgs.clone()));
        let a = r["choices"][0]["message"]["content"].as_str().unwrap().to_owned();
        cached.push(r["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap());
        msgs.push(json!({ "role": "assistant", "content": a }));
        answers.push(a);
        if next.is_empty() {
            break;
        }
        msgs.push(json!({ "role": "user", "content": next }));
    }
    (answers, cached)
}

fn multi_turn_reuse(batch: &str) {
    let m = model("tiny/tiny-llama-f32");
    let cold = Server::start(&m, &["--prompt-cache", "0", "--batch", batch]);
    let (want, cold_cached) = conversation(&cold);
    assert!(cold_cached.iter().all(|&c| c == 0), "a disabled cache reused state: {cold_cached:?}");
    let warm = Server::start(&m, &["--prompt-cache", "0.5", "--batch", batch]);
    let (got, cached) = conversation(&warm);
    assert_eq!(got, want, "prefix reuse changed the output");
    assert_eq!(cached[0], 0);
    assert!(cached[1] > 0 && cached[2] > cached[1], "later turns should reuse more and more: {cached:?}");
    let metrics = warm.request("GET", "/metrics", &[], b"").text();
    let value = |name: &str| -> f64 {
        metrics
            .lines()
            .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
            .and_then(|l| l.split_whitespace().last())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} missing:\n{metrics}"))
    };
    assert_eq!(value("mlx_engine_prefix_cache_hits_total"), 2.0);
    assert_eq!(value("mlx_engine_prefix_cache_hit_tokens_total"), (cached[1] + cached[2]) as f64);
    assert!(value("mlx_engine_prefix_cache_bytes") > 0.0);
    assert_eq!(value("mlx_engine_time_to_first_token_seconds_count"), 3.0);
    assert!(metrics.contains("# TYPE mlx_engine_time_to_first_token_seconds histogram"));
    assert!(metrics.contains("mlx_engine_time_to_first_token_seconds_bucket{le=\"+Inf\"} 3"));
    // Per-request rates: three prefills; the decode rate needs >= 2 tokens.
    assert_eq!(value("mlx_engine_request_prefill_tokens_per_second_count"), 3.0);
    assert!(value("mlx_engine_request_prefill_tokens_per_second_sum") > 0.0);
    assert!(value("mlx_engine_request_decode_tokens_per_second_count") >= 1.0);
}

#[test]
fn multi_turn_chat_reuses_the_prefix_and_matches_a_cold_run_serial() {
    multi_turn_reuse("1");
}

#[test]
fn multi_turn_chat_reuses_the_prefix_and_matches_a_cold_run_batched() {
    multi_turn_reuse("8");
}

/// A hybrid model (recurrent DeltaNet state that cannot be trimmed): each
/// turn reuses the previous prompt-boundary snapshot at its exact length,
/// and the answers equal a cold run's.
#[test]
fn multi_turn_chat_on_a_recurrent_model_reuses_exact_snapshots() {
    let m = model("tiny/tiny-qwen3_5-f32");
    for batch in ["1", "8"] {
        let (want, _) = conversation(&Server::start(&m, &["--prompt-cache", "0", "--batch", batch]));
        let (got, cached) = conversation(&Server::start(&m, &["--prompt-cache", "0.5", "--batch", batch]));
        assert_eq!(got, want, "--batch {batch}: prefix reuse changed the output");
        assert_eq!(cached[0], 0);
        assert!(
            cached[1] > 0 && cached[2] > cached[1],
            "--batch {batch}: later turns should reuse more and more: {cached:?}"
        );
    }
}
