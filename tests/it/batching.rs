//! Continuous batching: requests that arrive at different times share
//! decode steps, and each one's greedy output is exactly what it gets alone
//! (f32 models: the batched kernels differ only in accumulation order); a
//! row that is cancelled leaves the others untouched.

use it::{model, Server};
use serde_json::{json, Value};
use std::io::{Read, Write};

const PROMPTS: &[&[u32]] =
    &[&[1, 2, 3], &[5, 6, 7, 8, 9, 10, 11], &[100, 200], &[7; 14], &[42], &[300, 301, 302, 303, 304]];

fn body(i: usize) -> Value {
    json!({ "prompt": PROMPTS[i], "max_tokens": 24 + 7 * i, "temperature": 0 })
}

fn text(r: &Value) -> String {
    r["choices"][0]["text"].as_str().unwrap().to_owned()
}

/// Each prompt alone on a strictly serial server.
fn serial_texts(m: &std::path::Path) -> Vec<String> {
    let s = Server::start(m, &["--batch", "1"]);
    (0..PROMPTS.len()).map(|i| text(&s.post("/v1/completions", &body(i)).json())).collect()
}

pub(crate) fn staggered_batch_equals_serial(name: &str) {
    let m = model(name);
    let want = serial_texts(&m);
    let s = Server::start(&m, &["--batch", "8", "--debug-endpoints"]);
    let bodies: Vec<Value> = (0..PROMPTS.len()).map(body).collect();
    // Each request joins the running batch after the earlier ones took 3 steps.
    let got: Vec<String> = s.post_joining("/v1/completions", &bodies, 3).iter().map(text).collect();
    let st = s.stats();
    assert!(st["max_batch_rows"].as_u64().unwrap() >= 2, "requests never shared a step: {st}");
    // Greedy rows without penalties queue each step before reading the last.
    assert!(st["pipelined_steps"].as_u64().unwrap() > 0, "no step was pipelined: {st}");
    for i in 0..PROMPTS.len() {
        assert_eq!(got[i], want[i], "{name}: request {i} differs between batched and serial runs");
    }
}

#[test]
fn staggered_requests_batch_and_match_serial_llama_f32() {
    staggered_batch_equals_serial("tiny/tiny-llama-f32");
}

#[test]
fn staggered_requests_batch_and_match_serial_qwen3_f32() {
    staggered_batch_equals_serial("tiny/tiny-qwen3-f32");
}

/// A streaming row that its client abandons mid-answer, while three
/// others share its steps: they finish as they do alone, and the abandoned
/// row is dropped before its `max_tokens`.
#[test]
fn a_cancelled_row_does_not_disturb_the_others() {
    let m = model("tiny/tiny-llama-f32");
    let want = serial_texts(&m);
    let s = Server::start(&m, &["--batch", "8", "--debug-endpoints"]);
    // All four are queued while the engine is held and admitted together.
    s.hold();
    let long = json!({ "prompt": [9, 9, 9], "max_tokens": 2000, "stream": true, "temperature": 0 }).to_string();
    let mut sock = std::net::TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    write!(sock, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{long}", long.len()).unwrap();
    s.wait_for("the long request to be queued", |st| st["queued"] == 1);
    let got: Vec<String> = std::thread::scope(|sc| {
        let mut hs = Vec::new();
        for i in 0..3 {
            let s = &s;
            hs.push(sc.spawn(move || text(&s.post("/v1/completions", &body(i)).json())));
            s.wait_for("the next request to be queued", |st| st["queued"].as_u64() == Some(i as u64 + 2));
        }
        s.release();
        let mut buf = [0u8; 4096];
        let mut seen = 0;
        while seen < 5 {
            let n = sock.read(&mut buf).unwrap();
            assert!(n > 0);
            seen += String::from_utf8_lossy(&buf[..n]).matches("data: ").count();
        }
        // The client leaves while every row is still decoding (the shortest
        // of the others has 24 tokens to go, fewer than 8 steps have run).
        s.hold();
        let st = s.wait_for("the engine to hold", |st| st["hold"]["parked"] == true);
        assert_eq!(st["active"], 4, "the rows no longer ran together when the client left: {st}");
        drop(sock);
        s.release();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for i in 0..3 {
        assert_eq!(got[i], want[i], "request {i} changed when a neighbour was cancelled");
    }
    s.wait_for("the abandoned row to be cancelled", |st| st["cancelled"] == 1);
    assert!(s.stats()["last_cancelled_tokens"].as_u64().unwrap() < 2000);
}

/// Seeded rows in one batch, two of them with the same seed: each draws
/// what the seed draws alone.
#[test]
fn seeded_sampling_is_reproducible_inside_a_batch() {
    let m = model("tiny/tiny-llama-f32");
    let s = Server::start(&m, &["--batch", "8", "--debug-endpoints"]);
    let req = |seed: u64| json!({ "prompt": [1, 2, 3], "max_tokens": 20, "temperature": 1.0, "seed": seed });
    let alone = text(&s.post("/v1/completions", &req(7)).json());
    let bodies: Vec<Value> = [7u64, 8, 7, 9].iter().map(|&seed| req(seed)).collect();
    let together: Vec<String> = s.post_burst("/v1/completions", &bodies).iter().map(text).collect();
    let st = s.stats();
    assert!(st["max_batch_rows"].as_u64().unwrap() >= 4, "the seeded rows never shared a step: {st}");
    assert_eq!(together[0], alone, "a seeded row changed when batched");
    assert_eq!(together[2], alone);
    assert_ne!(together[1], alone, "seeds 7 and 8 drew the same 20 tokens");
}

/// bf16 (`--dtype native`): batched and serial kernels round differently
/// (matmul shapes, masks), so exact equality is not promised. What we prove:
/// per-token logprobs agree within TOL nats, and where the chosen tokens
/// diverge the serial run had a near-tie (its top-2 gap below TOL), i.e.
/// a divergence is rounding, never a wrong computation.
#[test]
fn bf16_batched_runs_match_serial_within_the_stated_tolerance() {
    const TOL: f64 = 0.1;
    let m = model("tiny/tiny-llama-bf16");
    let body = |i: usize| json!({ "prompt": PROMPTS[i], "max_tokens": 24, "temperature": 0, "logprobs": 2 });
    let serial: Vec<Value> = {
        let s = Server::start(&m, &["--batch", "1", "--dtype", "native"]);
        (0..PROMPTS.len()).map(|i| s.post("/v1/completions", &body(i)).json()).collect()
    };
    let s = Server::start(&m, &["--batch", "8", "--dtype", "native", "--debug-endpoints"]);
    let bodies: Vec<Value> = (0..PROMPTS.len()).map(body).collect();
    let batched: Vec<Value> = s.post_joining("/v1/completions", &bodies, 3);
    assert!(s.stats()["max_batch_rows"].as_u64().unwrap() >= 2);
    let mut compared = 0;
    for (i, (a, b)) in serial.iter().zip(&batched).enumerate() {
        let (la, lb) = (&a["choices"][0]["logprobs"], &b["choices"][0]["logprobs"]);
        let (ta, tb) = (la["tokens"].as_array().unwrap(), lb["tokens"].as_array().unwrap());
        for k in 0..ta.len().min(tb.len()) {
            let (pa, pb) = (la["token_logprobs"][k].as_f64().unwrap(), lb["token_logprobs"][k].as_f64().unwrap());
            if ta[k] != tb[k] {
                let mut top: Vec<f64> =
                    la["top_logprobs"][k].as_object().unwrap().values().map(|v| v.as_f64().unwrap()).collect();
                top.sort_by(|x, y| y.total_cmp(x));
                assert!(
                    top.len() == 2 && top[0] - top[1] < TOL,
                    "request {i} step {k}: tokens diverge without a near-tie (top-2 {top:?})"
                );
                break; // past a divergence the two runs continue different texts
            }
            assert!((pa - pb).abs() <= TOL, "request {i} step {k}: logprob {pa} (serial) vs {pb} (batched)");
            compared += 1;
        }
    }
    assert!(compared >= 40, "too few positions compared ({compared})");
}

/// A burst of requests queued while the engine is held is admitted together
/// and prefills as ONE left-padded cohort (`cohort_prefills` in /stats), and
/// each row's greedy output still equals its serial run.
#[test]
fn a_burst_prefills_as_one_padded_cohort_and_matches_serial() {
    let m = model("tiny/tiny-llama-f32");
    // Heads (prompt minus last token) of 6..11 tokens: within a factor of two.
    let prompts: Vec<Vec<u32>> = (0..6u32).map(|i| (0..7 + i).map(|k| 10 + 37 * i + 3 * k).collect()).collect();
    let body = |p: &Vec<u32>| json!({ "prompt": p, "max_tokens": 20, "temperature": 0 });
    let want: Vec<String> = {
        let s = Server::start(&m, &["--batch", "1"]);
        prompts.iter().map(|p| text(&s.post("/v1/completions", &body(p)).json())).collect()
    };
    let s = Server::start(&m, &["--batch", "8", "--debug-endpoints"]);
    let bodies: Vec<Value> = prompts.iter().map(body).collect();
    let got: Vec<String> = s.post_burst("/v1/completions", &bodies).iter().map(text).collect();
    assert_one_cohort_matching_serial(&s, &got, &want);
}

/// The burst prefilled as exactly one cohort of all its rows, and each
/// row's text equals its serial run's.
fn assert_one_cohort_matching_serial(s: &Server, got: &[String], want: &[String]) {
    let st = s.stats();
    assert_eq!(
        (st["cohort_prefills"].as_u64().unwrap(), st["cohort_rows"].as_u64().unwrap()),
        (1, want.len() as u64),
        "the burst did not prefill as one cohort: {st}"
    );
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g, w, "request {i} differs between its cohort prefill and its serial run");
    }
}

/// A burst whose prompts share a prefix already in the prefix cache (as
/// chat requests share their template's opening and system prompt)
/// prefills as ONE cohort that starts from the cached tokens: the longest
/// row is cached up to the end of the shared prefix, a row padded by p
/// columns holds p fewer cached tokens there, and each reports those as
/// cached. So does a shared prefix longer than a cohort would recompute
/// (300 tokens). Every row's greedy output equals its serial run without
/// any cache.
#[test]
fn a_burst_sharing_a_cached_prefix_prefills_as_one_cohort_from_the_cached_tokens() {
    let m = model("tiny/tiny-llama-f32");
    let body = |p: &Vec<u32>| json!({ "prompt": p, "max_tokens": 20, "temperature": 0 });
    for shared_len in [12u32, 300] {
        let shared: Vec<u32> = (0..shared_len).map(|k| 5 + (2 * k) % 400).collect();
        // Suffixes of 3..8 tokens: heads padded 5..0.
        let prompts: Vec<Vec<u32>> = (0..6u32)
            .map(|i| shared.iter().copied().chain((0..3 + i).map(|k| 440 + 37 * i + 3 * k)).collect())
            .collect();
        let width = prompts.iter().map(|p| p.len() - 1).max().unwrap();
        // Both layouts whose batched rows equal serial ones: plain K/V, pages.
        for layout in [&[][..], &["--paged-kv"]] {
            let want: Vec<String> = {
                let s = Server::start(&m, &[&["--batch", "1", "--prompt-cache", "0"], layout].concat());
                prompts.iter().map(|p| text(&s.post("/v1/completions", &body(p)).json())).collect()
            };
            let s = Server::start(&m, &[&["--batch", "8", "--debug-endpoints"], layout].concat());
            let warm: Vec<u32> = shared.iter().copied().chain([900, 901, 902]).collect();
            s.post("/v1/completions", &body(&warm)).json();
            let bodies: Vec<Value> = prompts.iter().map(body).collect();
            let got = s.post_burst("/v1/completions", &bodies);
            assert_one_cohort_matching_serial(&s, &got.iter().map(text).collect::<Vec<_>>(), &want);
            for (i, (g, p)) in got.iter().zip(&prompts).enumerate() {
                let pad = width - (p.len() - 1);
                let cached = g["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64();
                assert_eq!(
                    cached,
                    Some((shared_len as usize - pad) as u64),
                    "{shared_len} shared, {layout:?}, request {i}: {g}"
                );
            }
        }
    }
}

/// A burst whose prompts share a short cached prefix but differ in length
/// by more than it (a row would be padding alone where the cache ends)
/// still prefills as ONE cohort: the short prefix is recomputed rather than
/// forcing the rows to join one at a time, and is not reported as cached.
#[test]
fn a_burst_sharing_a_short_cached_prefix_of_rows_far_apart_recomputes_it_in_one_cohort() {
    let m = model("tiny/tiny-llama-f32");
    let shared = [5u32, 6, 7, 8];
    let prompts: Vec<Vec<u32>> =
        (0..6u32).map(|i| shared.iter().copied().chain((0..4 + i).map(|k| 10 + 37 * i + 3 * k)).collect()).collect();
    let body = |p: &Vec<u32>| json!({ "prompt": p, "max_tokens": 20, "temperature": 0 });
    let want: Vec<String> = {
        let s = Server::start(&m, &["--batch", "1", "--prompt-cache", "0"]);
        prompts.iter().map(|p| text(&s.post("/v1/completions", &body(p)).json())).collect()
    };
    let s = Server::start(&m, &["--batch", "8", "--debug-endpoints"]);
    // Leaves the shared prefix (and more) in the prefix cache.
    let warm: Vec<u32> = shared.iter().copied().chain([90, 91, 92]).collect();
    s.post("/v1/completions", &body(&warm)).json();
    let bodies: Vec<Value> = prompts.iter().map(body).collect();
    let got = s.post_burst("/v1/completions", &bodies);
    assert_one_cohort_matching_serial(&s, &got.iter().map(text).collect::<Vec<_>>(), &want);
    for (i, g) in got.iter().enumerate() {
        assert_eq!(g["usage"]["prompt_tokens_details"]["cached_tokens"], 0, "request {i}: {g}");
    }
}
