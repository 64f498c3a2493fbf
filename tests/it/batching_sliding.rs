//! Continuous batching of sliding-window models (kv-rotating's batched
//! ring, mlx-lm's `BatchRotatingKVCache`): requests that share decode steps,
//! prefill as a left-padded cohort or speculate inside the batch produce
//! exactly their serial greedy output (f32). The tiny models' window is 8,
//! so every row here wraps its ring while batched, and the long prompts are
//! wrapped rings already when their rows merge.

use it::{model, Server};
use serde_json::{json, Value};

const MODELS: [&str; 3] = ["tiny/tiny-llama-swa-f32", "tiny/tiny-gemma3-f32", "tiny/tiny-gemma4-f32"];

fn text(r: &Value) -> String {
    r["choices"][0]["text"].as_str().unwrap_or_else(|| panic!("no text in {r}")).to_owned()
}

/// Prompts of 9 to 30 tokens (all longer than the window), and a short one.
fn long_prompts() -> Vec<Vec<u32>> {
    [20usize, 9, 30, 13, 3, 17]
        .iter()
        .enumerate()
        .map(|(i, &n)| (0..n as u32).map(|k| 50 + 97 * i as u32 + 13 * k).collect())
        .collect()
}

fn body(p: &[u32], i: usize) -> Value {
    json!({ "prompt": p, "max_tokens": 20 + 6 * i, "temperature": 0 })
}

/// Each prompt alone on a strictly serial server.
fn serial_texts(m: &std::path::Path, prompts: &[Vec<u32>]) -> Vec<String> {
    let s = Server::start(m, &["--batch", "1"]);
    prompts.iter().enumerate().map(|(i, p)| text(&s.post("/v1/completions", &body(p, i)).json())).collect()
}

/// Requests joining `s`'s running batch one after another (each after the
/// earlier rows took 3 steps), answered concurrently.
fn joining(s: &Server, prompts: &[Vec<u32>]) -> Vec<String> {
    s.post_joining("/v1/completions", &bodies(prompts), 3).iter().map(text).collect()
}

fn bodies(prompts: &[Vec<u32>]) -> Vec<Value> {
    prompts.iter().enumerate().map(|(i, p)| body(p, i)).collect()
}

#[test]
fn staggered_requests_batch_and_match_serial_llama_swa_f32() {
    crate::batching::staggered_batch_equals_serial("tiny/tiny-llama-swa-f32");
}

#[test]
fn staggered_requests_batch_and_match_serial_gemma3_f32() {
    crate::batching::staggered_batch_equals_serial("tiny/tiny-gemma3-f32");
}

#[test]
fn staggered_requests_batch_and_match_serial_gemma4_f32() {
    crate::batching::staggered_batch_equals_serial("tiny/tiny-gemma4-f32");
}

/// Rows merge as wrapped rings of different lengths into a batch whose ring
/// has already rotated, and leave it at different times.
#[test]
fn prompts_longer_than_the_window_batch_and_match_serial() {
    for name in MODELS {
        let m = model(name);
        let prompts = long_prompts();
        let want = serial_texts(&m, &prompts);
        let s = Server::start(&m, &["--batch", "8", "--debug-endpoints"]);
        let got = joining(&s, &prompts);
        let st = s.stats();
        assert!(st["max_batch_rows"].as_u64().unwrap() >= 2, "{name}: requests never shared a step: {st}");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                g,
                w,
                "{name}: request {i} ({} prompt tokens) differs between batched and serial runs",
                prompts[i].len()
            );
        }
    }
}

/// A burst queued while the engine is held prefills as ONE left-padded
/// cohort whose rows wrap their rings inside the padded prefill, then
/// decodes together.
#[test]
fn a_burst_of_long_prompts_prefills_as_a_cohort_and_matches_serial() {
    for name in MODELS {
        let m = model(name);
        // Heads of 10..15 tokens: within a factor of two, all past the window.
        let prompts: Vec<Vec<u32>> = (0..5u32).map(|i| (0..11 + i).map(|k| 20 + 41 * i + 7 * k).collect()).collect();
        let want = serial_texts(&m, &prompts);
        let s = Server::start(&m, &["--batch", "8", "--debug-endpoints"]);
        let got: Vec<String> = s.post_burst("/v1/completions", &bodies(&prompts)).iter().map(text).collect();
        let st = s.stats();
        assert!(
            st["cohort_prefills"].as_u64().unwrap() >= 1 && st["cohort_rows"].as_u64().unwrap() >= 2,
            "{name}: the burst never prefilled as a cohort: {st}"
        );
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g, w, "{name}: request {i} differs between its cohort prefill and its serial run");
        }
    }
}

/// Speculation inside the batch (model-llama runs it; n-gram drafts): one
/// `[B, k+1]` verify step per round, rows keep different counts and the
/// ring rolls each row back on its own (before and after it wrapped).
#[test]
fn batched_ngram_speculation_over_a_sliding_window_is_lossless() {
    let m = model("tiny/tiny-llama-swa-f32");
    // The random tiny model never repeats itself, so most drafts fail. The
    // first two prompts start with their last token followed by what this
    // model's greedy run then produces first (found by probing it): the
    // drafter proposes that continuation, the first draft is accepted and
    // the rest rejected, so those rows keep 2 while the others keep 1.
    let prompts: Vec<Vec<u32>> = vec![
        [&[10, 17784, 18177, 46339, 38101][..], &(1..=10).collect::<Vec<u32>>()].concat(),
        [&[310, 5275, 41673, 34364, 9451][..], &(300..=310).collect::<Vec<u32>>()].concat(),
        [1, 2, 3, 4, 5, 6].repeat(3),
        vec![7, 8, 9],
        [100, 200, 300, 400, 500, 600, 700, 800, 900].repeat(2),
        vec![11, 12, 11, 12, 11],
    ];
    let want = serial_texts(&m, &prompts);
    // --speculate-always: the cost rule depends on timing, and the counts
    // asserted below must not (a judged row may stop drafting).
    let s = Server::start(&m, &["--batch", "8", "--draft-kind", "ngram", "--speculate-always", "--debug-endpoints"]);
    let got: Vec<Value> = s.post_joining("/v1/completions", &bodies(&prompts), 3);
    assert!(s.stats()["max_batch_rows"].as_u64().unwrap() >= 2, "speculative rows never shared a step");
    let (mut drafted, mut accepted) = (0, 0);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(&text(g), w, "request {i} changed under batched speculation");
        let sp = &g["usage"]["speculation"];
        drafted += sp["drafted"].as_u64().unwrap_or(0);
        accepted += sp["accepted"].as_u64().unwrap_or(0);
    }
    assert!(
        accepted > 0 && accepted < drafted,
        "both kept and rejected drafts needed (drafted {drafted}, accepted {accepted})"
    );
}

/// A burst sharing a prefix the prefix cache holds starts its cohort from
/// the cached tokens over rotating layers too (window 8): each row's cached
/// ring (6 tokens, not yet wrapped) is trimmed to its share and merged
/// left-padded, then the rows wrap their rings inside the cohort's prefill.
/// Each row reports 6 - pad cached tokens, and its greedy output equals its
/// serial run without any cache.
#[test]
fn a_burst_sharing_a_cached_prefix_starts_its_cohort_from_it_over_rotating_layers() {
    let body = |p: &Vec<u32>| json!({ "prompt": p, "max_tokens": 20, "temperature": 0 });
    let shared: Vec<u32> = (0..6).map(|k| 5 + 2 * k).collect();
    // Suffixes of 3..5 tokens: heads of 8..10, padded 2..0.
    let prompts: Vec<Vec<u32>> =
        (0..3u32).map(|i| shared.iter().copied().chain((0..3 + i).map(|k| 440 + 37 * i + 3 * k)).collect()).collect();
    for name in ["tiny-llama-swa-f32", "tiny-gemma3-f32"] {
        let m = model(&format!("tiny/{name}"));
        let text = |r: &Value| r["choices"][0]["text"].as_str().unwrap().to_owned();
        let want: Vec<String> = {
            let s = Server::start(&m, &["--batch", "1", "--prompt-cache", "0"]);
            prompts.iter().map(|p| text(&s.post("/v1/completions", &body(p)).json())).collect()
        };
        let s = Server::start(&m, &["--batch", "8", "--debug-endpoints"]);
        let warm: Vec<u32> = shared.iter().copied().chain([900, 901]).collect();
        s.post("/v1/completions", &json!({ "prompt": warm, "max_tokens": 1, "temperature": 0 })).json();
        let got = s.post_burst("/v1/completions", &prompts.iter().map(body).collect::<Vec<_>>());
        let st = s.stats();
        assert_eq!((st["cohort_prefills"].as_u64(), st["cohort_rows"].as_u64()), (Some(1), Some(3)), "{name}: {st}");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(&text(g), w, "{name} request {i} differs from its serial run");
            assert_eq!(g["usage"]["prompt_tokens_details"]["cached_tokens"], 4 + i, "{name} request {i}: {g}");
        }
    }
}
