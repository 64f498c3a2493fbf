//! Completions' `echo` with `logprobs`: each prompt token's logprob under
//! the tokens before it (and the top alternatives) against mlx-lm's full
//! forward over the prompt (models/scripts/oracle.py, `prompt_logprobs`),
//! for a dense, a sliding-window and a hybrid (recurrent) family, on a
//! prompt short enough for one forward and on one that takes two chunks;
//! streamed and whole alike, and across an isolated engine's wire (the
//! `--tp` ranks: tensor_parallel.rs). Tolerance as parity.rs for f32:
//! |a-b| <= 1e-4 + 1e-4|b|.

use crate::parity::{floats, oracle};
use it::{model, Server};
use serde_json::{json, Value};

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-4 + 1e-4 * b.abs()
}

/// The scored prompt from a completion's `logprobs` (the prompt's tokens,
/// then the one generated token).
fn check_against_oracle(name: &str, ids: &[u32], ours: &Value) {
    let arg = ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    let reference =
        oracle(&model(&format!("tiny/{name}")), &["--prompt-ids", &arg, "--logits-only", "--prompt-logprobs"]);
    let want = reference["prompt_logprobs"].as_array().unwrap();
    let got = ours["token_logprobs"].as_array().unwrap();
    assert_eq!(got.len(), ids.len() + 1, "{name}: the prompt's tokens and the generated one");
    assert!(got[0].is_null() && want[0].is_null(), "{name}: the first token has no logprob");
    for i in 1..ids.len() {
        let (a, b) = (got[i].as_f64().unwrap(), want[i]["logprob"].as_f64().unwrap());
        assert!(close(a, b), "{name}: token {i}: ours {a}, mlx-lm {b}");
        // Alternatives are keyed by token text (ids sharing a text share a
        // key): each of ours is one of mlx-lm's top 5, and the best agrees.
        let tops: Vec<f64> =
            ours["top_logprobs"][i].as_object().unwrap().values().map(|v| v.as_f64().unwrap()).collect();
        let theirs = floats(&want[i]["logprobs"]);
        assert!(!tops.is_empty() && tops.len() <= 5, "{name}: token {i}: {tops:?}");
        assert!(tops.iter().all(|a| theirs.iter().any(|b| close(*a, *b))), "{name}: token {i}: {tops:?} vs {theirs:?}");
        let best = tops.iter().copied().fold(f64::MIN, f64::max);
        assert!(close(best, theirs[0]), "{name}: token {i}: best {best} vs {}", theirs[0]);
    }
    let offsets: Vec<u64> = ours["text_offset"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    assert!(offsets.windows(2).all(|w| w[0] <= w[1]), "{name}: text offsets go forward: {offsets:?}");
}

fn scored(s: &Server, ids: &[u32], stream: bool) -> Value {
    let body = json!({"prompt": ids, "echo": true, "logprobs": 5, "max_tokens": 1, "temperature": 0, "stream": stream});
    let r = s.post("/v1/completions", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    if !stream {
        return r.json()["choices"][0]["logprobs"].clone();
    }
    // The chunks' logprobs, joined.
    let mut joined = json!({"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []});
    for data in r.text().lines().filter_map(|l| l.strip_prefix("data: ")).filter(|d| *d != "[DONE]") {
        let v: Value = serde_json::from_str(data).unwrap();
        let lp = &v["choices"][0]["logprobs"];
        if lp.is_null() {
            continue;
        }
        for k in ["tokens", "token_logprobs", "top_logprobs", "text_offset"] {
            joined[k].as_array_mut().unwrap().extend(lp[k].as_array().unwrap().iter().cloned());
        }
    }
    joined
}

fn check(name: &str) {
    let s = Server::start(&model(&format!("tiny/{name}")), &[]);
    let short: Vec<u32> = vec![1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12];
    // Longer than a scoring forward (256 positions): two chunks over one cache.
    let long: Vec<u32> = (0..300u32).map(|i| 10 + (i * 7919) % 40000).collect();
    for ids in [&short, &long] {
        let whole = scored(&s, ids, false);
        check_against_oracle(name, ids, &whole);
        let streamed = scored(&s, ids, true);
        // The generated token's alternatives may tie in order; the prompt's part must match exactly.
        for k in ["tokens", "token_logprobs", "text_offset"] {
            assert_eq!(streamed[k], whole[k], "{name}: streamed {k} differ");
        }
    }
}

#[test]
fn prompt_logprobs_of_a_dense_model_match_mlx_lm() {
    check("tiny-llama-f32");
}

#[test]
fn prompt_logprobs_across_a_sliding_window_match_mlx_lm() {
    check("tiny-llama-swa-f32");
}

#[test]
fn prompt_logprobs_of_a_hybrid_model_match_mlx_lm() {
    check("tiny-qwen3_5-f32");
}

/// With the engine in its own process the scores cross the wire whole.
#[test]
fn prompt_logprobs_from_an_isolated_engine_equal_the_in_process_ones() {
    let ids: Vec<u32> = (0..40u32).map(|i| 10 + (i * 131) % 40000).collect();
    let here = scored(&Server::start(&model("tiny/tiny-llama-f32"), &[]), &ids, false);
    let there = scored(&Server::start(&model("tiny/tiny-llama-f32"), &["--isolate"]), &ids, false);
    assert_eq!(there, here);
}

/// `echo` with `max_tokens: 0` (what older harnesses send): the prompt
/// shown and scored, nothing generated, whole or streamed.
#[test]
fn echo_with_max_tokens_zero_scores_the_prompt_and_generates_nothing() {
    let s = Server::start(&model("tiny/tiny-llama-f32"), &[]);
    let ids: Vec<u32> = (0..20u32).map(|i| 10 + (i * 131) % 40000).collect();
    let with_one = scored(&s, &ids, false);
    for stream in [false, true] {
        let body = json!({"prompt": [ids.clone(), ids.clone()], "echo": true, "logprobs": 3, "max_tokens": 0, "stream": stream,
            "stream_options": {"include_usage": true}});
        let r = s.post("/v1/completions", &body);
        assert_eq!(r.status, 200, "{}", r.text());
        let bodies: Vec<Value> = if stream {
            r.text()
                .lines()
                .filter_map(|l| l.strip_prefix("data: "))
                .filter(|d| *d != "[DONE]")
                .map(|d| serde_json::from_str(d).unwrap())
                .collect()
        } else {
            vec![r.json()]
        };
        let choices: Vec<&Value> = bodies.iter().flat_map(|b| b["choices"].as_array().unwrap()).collect();
        assert_eq!(choices.len(), 2, "{bodies:?}");
        for c in choices {
            assert_eq!(c["finish_reason"], "length");
            let lp = &c["logprobs"];
            assert_eq!(lp["tokens"].as_array().unwrap().len(), ids.len());
            assert_eq!(
                lp["token_logprobs"].as_array().unwrap()[..],
                with_one["token_logprobs"].as_array().unwrap()[..ids.len()]
            );
        }
        let usage = &bodies.last().unwrap()["usage"];
        assert_eq!(
            (usage["prompt_tokens"].as_u64(), usage["completion_tokens"].as_u64()),
            (Some(2 * ids.len() as u64), Some(0)),
            "{usage}"
        );
    }
}
