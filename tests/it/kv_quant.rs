//! Quantized K/V (`--kv-quant 8|4`, kv-plain and kv-rotating in the affine
//! schemes): greedy tokens and every step's log-probabilities equal mlx-lm's
//! `generate_step` with `kv_bits` / `kv_group_size` / `quantized_kv_start`
//! on tiny folders of several families (head_dim 64: one group per head
//! row); batched rows equal serial ones; speculation and the prefix cache
//! change nothing; a token costs what the scheme says and `host fit` finds
//! the larger context; flags that cannot be served are refused at start.
//!
//! mlx-lm has no quantized rotating cache: for sliding-window layers the
//! oracle quantizes what mlx-lm's RotatingKVCache hands out
//! (models/scripts/oracle.py, `QuantizedWindow`).

use crate::parity::{assert_close, floats, host_json, ids, oracle};
use it::{host_bin, model, Server};
use serde_json::{json, Value};

const PROMPT: &str = "1,2,3,4,5";

/// What `host generate` and the oracle are both told.
struct Kv {
    bits: u32,
    group: u32,
    start: u64,
}

const KV8: Kv = Kv { bits: 8, group: 64, start: 0 };
const KV4: Kv = Kv { bits: 4, group: 64, start: 0 };

fn generate(dir: &str, prompt: &str, n: usize, extra: &[&str]) -> Value {
    let n = n.to_string();
    let mut args = vec![
        "generate",
        "--model",
        dir,
        "--prompt-ids",
        prompt,
        "--max-tokens",
        &n,
        "--ignore-eos",
        "--dtype",
        "native",
        "--logprobs",
        "5",
        "--json",
    ];
    args.extend_from_slice(extra);
    host_json(&args)
}

/// `name` with `kv` against mlx-lm: tokens identical, the chosen and top-5
/// log-probabilities of every step within the parity tolerances; and the
/// scheme is in effect (plain K/V give other log-probabilities).
fn check(name: &str, prompt: &str, n: usize, kv: &Kv) {
    let dir = model(&format!("tiny/{name}"));
    let d = dir.to_str().unwrap();
    let (bits, group, start) = (kv.bits.to_string(), kv.group.to_string(), kv.start.to_string());
    let n_s = n.to_string();
    let r = oracle(
        &dir,
        &[
            "--prompt-ids",
            prompt,
            "--max-tokens",
            &n_s,
            "--kv-bits",
            &bits,
            "--kv-group-size",
            &group,
            "--quantized-kv-start",
            &start,
        ],
    );
    let flags = ["--kv-quant", &bits, "--kv-group-size", &group, "--quantized-kv-start", &start];
    let ours = generate(d, prompt, n, &flags);
    let what = format!("{name} kv {bits}-bit group {group} start {start}");
    assert_eq!(ours["kv_scheme"], format!("affine{bits}:group={group},start={start}"), "{what}");
    let layer_schemes = ours["layer_kv_schemes"].as_array().unwrap();
    assert!(layer_schemes.iter().any(|s| *s == ours["kv_scheme"]), "{what}: no layer in the scheme");
    let (want, got) = (ids(&r["tokens"]), ids(&ours["tokens"]));
    assert_eq!(want.len(), n);
    if want != got {
        let i = want.iter().zip(&got).position(|(a, b)| a != b).unwrap_or(want.len().min(got.len()));
        panic!("{what}: greedy tokens diverge from mlx-lm at step {i}: ours {:?} vs {:?}", &got[i..], &want[i..]);
    }
    let tol = if name.ends_with("-f32") { (1e-4, 1e-4) } else { (0.05, 0.02) };
    let steps = ours["logprobs"].as_array().unwrap();
    let want_steps = r["step_logprobs_top"].as_array().unwrap();
    assert_eq!(steps.len(), want_steps.len());
    let chosen: Vec<f64> = steps.iter().map(|s| s["logprob"].as_f64().unwrap_or(f64::NAN)).collect();
    for (i, (s, w)) in steps.iter().zip(want_steps).enumerate() {
        let want_top = floats(&w["logprobs"]);
        let top: Vec<f64> = s["top"].as_array().unwrap().iter().map(|p| p[1].as_f64().unwrap_or(f64::NAN)).collect();
        assert_close(&top, &want_top, tol, &format!("{what}: step {i}'s top-5 log-probabilities"));
        assert_close(&[chosen[i]], &want_top[..1], tol, &format!("{what}: step {i}'s chosen log-probability"));
    }
    let plain = generate(d, prompt, n, &[]);
    let plain_chosen: Vec<f64> =
        plain["logprobs"].as_array().unwrap().iter().map(|s| s["logprob"].as_f64().unwrap()).collect();
    let moved = chosen.iter().zip(&plain_chosen).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
    assert!(moved > 1e-3, "{what}: the log-probabilities equal plain K/V's (largest difference {moved})");
}

macro_rules! kv_parity {
    ($($test:ident => ($name:literal, $kv:expr),)*) => { $( #[test] fn $test() { check($name, PROMPT, 64, &$kv); } )* };
}

kv_parity! {
    llama_f32_kv8 => ("tiny-llama-hd64-f32", KV8),
    llama_f32_kv4 => ("tiny-llama-hd64-f32", KV4),
    llama_bf16_kv8 => ("tiny-llama-hd64-bf16", KV8),
    llama_bf16_kv4 => ("tiny-llama-hd64-bf16", KV4),
    qwen3_f32_kv8 => ("tiny-qwen3-hd64-f32", KV8),
    qwen3_f32_kv4 => ("tiny-qwen3-hd64-f32", KV4),
    // Sliding layers (window 8) in the quantized ring, full ones in kv-plain.
    gemma3_f32_kv8 => ("tiny-gemma3-hd64-f32", KV8),
    gemma3_f32_kv4 => ("tiny-gemma3-hd64-f32", KV4),
    gemma3_bf16_kv8 => ("tiny-gemma3-hd64-bf16", KV8),
    // The hybrid: gated attention layers quantized, DeltaNet state as it is.
    qwen3_5_f32_kv8 => ("tiny-qwen3_5-hd64-f32", KV8),
    qwen3_5_f32_kv4 => ("tiny-qwen3_5-hd64-f32", KV4),
    // Groups of 32, and a start of 20: the switch comes mid-decode.
    llama_f32_kv4_group32_start20 => ("tiny-llama-hd64-f32", Kv { bits: 4, group: 32, start: 20 }),
    gemma3_f32_kv8_start20 => ("tiny-gemma3-hd64-f32", Kv { bits: 8, group: 64, start: 20 }),
}

fn spread_ids(n: u64) -> String {
    (0..n).map(|i| ((i * 7919) % 49000 + 10).to_string()).collect::<Vec<_>>().join(",")
}

/// A prompt past the window: the prefill wraps the ring (mlx-lm's
/// multi-token concat path) before the K/V turn into codes.
#[test]
fn gemma3_prompt_longer_than_the_window_kv4() {
    check("tiny-gemma3-hd64-f32", &spread_ids(40), 24, &KV4);
}

/// 2100 prompt tokens: the first prefill chunk (2048) attends plain K/V,
/// the rest of the prompt attends codes under a causal mask.
#[test]
fn a_prompt_of_two_prefill_chunks_switches_between_them() {
    check("tiny-llama-hd64-f32", &spread_ids(2100), 8, &KV8);
}

fn text(r: &Value) -> String {
    r["choices"][0]["text"].as_str().unwrap_or_else(|| panic!("no text in {r}")).to_owned()
}

fn prompts() -> Vec<Vec<u32>> {
    [20usize, 9, 30, 13, 3, 17]
        .iter()
        .enumerate()
        .map(|(i, &n)| (0..n as u32).map(|k| 50 + 97 * i as u32 + 13 * k).collect())
        .collect()
}

fn bodies(prompts: &[Vec<u32>]) -> Vec<Value> {
    prompts
        .iter()
        .enumerate()
        .map(|(i, p)| json!({ "prompt": p, "max_tokens": 20 + 6 * i, "temperature": 0 }))
        .collect()
}

fn serial_texts(m: &std::path::Path, prompts: &[Vec<u32>], extra: &[&str]) -> Vec<String> {
    let s = Server::start(m, &[&["--batch", "1"], extra].concat());
    bodies(prompts).iter().map(|b| text(&s.post("/v1/completions", b).json())).collect()
}

const MODELS: [&str; 3] = ["tiny/tiny-llama-hd64-f32", "tiny/tiny-gemma3-hd64-f32", "tiny/tiny-qwen3_5-hd64-f32"];

/// Rows that join a running batch one after another, and a burst that
/// prefills as one left-padded cohort, against each row's serial run.
///
/// Batched kernels round f32 differently from serial ones (a `[B, L]`
/// matmul is blocked differently from a `[1, L]` one: logprobs differ by
/// ~1e-6 with plain K/V), and a value sitting on a rounding boundary of the
/// quantizer then gets the neighbouring code: the difference grows to a
/// quantization step. So the promise is bf16's (batching.rs): every
/// logprob within TOL of the serial run's, and tokens diverge only where
/// the serial run had a near-tie (top-2 gap under TOL).
#[test]
fn batched_rows_over_quantized_kv_match_serial() {
    const TOL: f64 = 0.1;
    for name in MODELS {
        let m = model(name);
        let prompts = prompts();
        for kv in [["--kv-quant", "8"], ["--kv-quant", "4"], ["--kv-quant", "turbo"]] {
            let bodies: Vec<Value> = bodies(&prompts)
                .into_iter()
                .map(|mut b| {
                    b["logprobs"] = json!(2);
                    b
                })
                .collect();
            let serial: Vec<Value> = {
                let s = Server::start(&m, &[&["--batch", "1"], &kv[..]].concat());
                bodies.iter().map(|b| s.post("/v1/completions", b).json()).collect()
            };
            let s = Server::start(&m, &[&["--batch", "8", "--debug-endpoints"], &kv[..]].concat());
            let burst = s.post_burst("/v1/completions", &bodies);
            let st = s.stats();
            assert!(
                st["cohort_prefills"].as_u64().unwrap() >= 1,
                "{name}: the burst never prefilled as a cohort: {st}"
            );
            // (The joining rows find their prompts in the prefix cache.)
            let joined = s.post_joining("/v1/completions", &bodies, 3);
            assert!(s.stats()["max_batch_rows"].as_u64().unwrap() >= 2, "{name}: requests never shared a step");
            let mut exact = 0;
            for (how, runs) in [("cohort", &burst), ("joining", &joined)] {
                for (i, (a, b)) in serial.iter().zip(runs).enumerate() {
                    let what = format!("{name} {kv:?} {how} request {i}");
                    exact += usize::from(within_tolerance(a, b, TOL, &what));
                }
            }
            assert!(exact >= 2 * prompts.len() - 2, "{name} {kv:?}: only {exact} rows equal their serial run");
            let plain = Server::start(&m, &["--batch", "1"]).post("/v1/completions", &bodies[0]).json();
            let lp = |r: &Value| -> Vec<f64> {
                let l = r["choices"][0]["logprobs"]["token_logprobs"].as_array().unwrap().clone();
                l.iter().map(|x| x.as_f64().unwrap()).collect()
            };
            let moved = lp(&plain).iter().zip(lp(&serial[0])).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
            assert!(moved > 1e-3, "{name} {kv:?}: the scheme changed nothing");
        }
    }
}

/// Whether batched output `b` equals serial `a`; fails unless every
/// logprob is within `tol` up to where the tokens diverge, at a near-tie.
fn within_tolerance(a: &Value, b: &Value, tol: f64, what: &str) -> bool {
    let (la, lb) = (&a["choices"][0]["logprobs"], &b["choices"][0]["logprobs"]);
    let (ta, tb) = (la["tokens"].as_array().unwrap(), lb["tokens"].as_array().unwrap());
    assert_eq!(ta.len(), tb.len(), "{what}");
    for k in 0..ta.len() {
        let (pa, pb) = (la["token_logprobs"][k].as_f64().unwrap(), lb["token_logprobs"][k].as_f64().unwrap());
        if ta[k] != tb[k] {
            let mut top: Vec<f64> =
                la["top_logprobs"][k].as_object().unwrap().values().map(|v| v.as_f64().unwrap()).collect();
            top.sort_by(|x, y| y.total_cmp(x));
            assert!(
                top.len() == 2 && top[0] - top[1] < tol,
                "{what} step {k}: tokens diverge without a near-tie {top:?}"
            );
            return false;
        }
        assert!((pa - pb).abs() <= tol, "{what} step {k}: logprob {pa} (serial) vs {pb} (batched)");
    }
    true
}

/// Drafts from n-grams and from a plain-K/V copy of the model (accepted
/// where the quantized target agrees, rejected where quantization moved its
/// choice): the output is the non-speculative one, serial and batched.
#[test]
fn speculation_over_quantized_kv_is_lossless() {
    let ids = "1,2,3,4,5,6,1,2,3,4,5,6,1,2,3";
    for name in ["tiny-llama-hd64-f32", "tiny-gemma3-hd64-f32"] {
        let dir = model(&format!("tiny/{name}"));
        let d = dir.to_str().unwrap();
        for bits in ["8", "4", "turbo"] {
            let want = ids_of(&generate(d, ids, 48, &["--kv-quant", bits]));
            let (mut drafted, mut accepted) = (0, 0);
            for draft in [&["--draft-kind", "ngram"][..], &["--draft-kind", "two-model", "--draft-model", d][..]] {
                let args = [&["--kv-quant", bits, "--speculate-always"][..], draft].concat();
                let spec = generate(d, ids, 48, &args);
                assert_eq!(ids_of(&spec), want, "{name} {bits}-bit {draft:?}: speculation changed the output");
                drafted += spec["speculation"]["drafted"].as_u64().unwrap();
                accepted += spec["speculation"]["accepted"].as_u64().unwrap();
            }
            if name.contains("llama") {
                assert!(accepted > 0 && accepted < drafted, "{name}: drafted {drafted}, accepted {accepted}");
            }
        }
        // Inside the batch: per-row rollbacks over codes (and over the
        // quantized ring for gemma3, whose serial ring refuses rounds once
        // it wraps).
        let prompts = prompts();
        let want = serial_texts(&dir, &prompts, &["--kv-quant", "8"]);
        let flags = ["--batch", "8", "--kv-quant", "8", "--draft-kind", "two-model", "--draft-model", d];
        let s = Server::start(&dir, &[&flags[..], &["--speculate-always", "--debug-endpoints"]].concat());
        let got = s.post_joining("/v1/completions", &bodies(&prompts), 3);
        assert!(s.stats()["max_batch_rows"].as_u64().unwrap() >= 2, "{name}: speculative rows never shared a step");
        let (mut drafted, mut accepted) = (0, 0);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(&text(g), w, "{name}: request {i} changed under batched speculation");
            drafted += g["usage"]["speculation"]["drafted"].as_u64().unwrap_or(0);
            accepted += g["usage"]["speculation"]["accepted"].as_u64().unwrap_or(0);
        }
        assert!(accepted > 0 && accepted < drafted, "{name} batched: drafted {drafted}, accepted {accepted}");
    }
}

fn ids_of(v: &Value) -> Vec<u64> {
    ids(&v["tokens"])
}

/// The same prompt twice: the second request reuses the first one's state
/// (in codes, under the scheme's namespace) and answers the same.
#[test]
fn the_prefix_cache_reuses_quantized_state() {
    for name in ["tiny/tiny-llama-hd64-f32", "tiny/tiny-gemma3-hd64-f32"] {
        let m = model(name);
        for (batch, quant, says) in [
            ("1", "8", "KV affine8:group=64,start=0 on every layer"),
            ("8", "8", "KV affine8:group=64,start=0 on every layer"),
            ("8", "turbo", "KV turbo:k=8,v=3,group=64,start=0 on"),
        ] {
            // The scheme from the TOML file (`kv_quant`), the rest as flags.
            let scratch = it::Scratch::new("kv-toml");
            let toml = scratch.0.join("serve.toml");
            std::fs::write(&toml, format!("kv_quant = \"{quant}\"\nkv_group_size = 64\n")).unwrap();
            let s = Server::start(&m, &["--config", toml.to_str().unwrap(), "--prompt-cache", "0.5", "--batch", batch]);
            let log = std::fs::read_to_string(&s.log).unwrap();
            assert!(log.contains(says), "{log}");
            let body = json!({ "prompt": spread_ids(30).split(',').map(|t| t.parse::<u32>().unwrap()).collect::<Vec<_>>(), "max_tokens": 24, "temperature": 0 });
            let a = s.post("/v1/completions", &body).json();
            let b = s.post("/v1/completions", &body).json();
            let cached = |r: &Value| r["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
            assert_eq!(cached(&a), 0, "{name} batch {batch}");
            assert_eq!(cached(&b), 29, "{name} batch {batch}: the second request reuses all but the last token");
            assert_eq!(text(&b), text(&a), "{name} batch {batch}: reuse changed the output");
        }
    }
}

fn fit(dir: &str, extra: &[&str]) -> (u64, u64) {
    let out = it::run_ok(
        std::process::Command::new(host_bin())
            .current_dir(it::repo_root())
            .args(["fit", "--model", dir, "--dtype", "native", "--ctx", "4096", "--memory-budget", "0.25"])
            .args(extra),
    );
    let number_after = |key: &str| -> u64 {
        let line = out.lines().find(|l| l.starts_with(key)).unwrap_or_else(|| panic!("no `{key}` in:\n{out}"));
        line[key.len()..].split_whitespace().next().unwrap().parse().unwrap()
    };
    (number_after("KV"), number_after("largest context that fits:"))
}

/// bf16 K/V against codes: 8-bit costs 68/128 and 4-bit 36/128 of a token
/// (scales and biases included), and the same budget fits more context.
#[test]
fn fit_reports_code_bytes_and_a_larger_context() {
    let dir = model("tiny/tiny-llama-hd64-bf16");
    let d = dir.to_str().unwrap();
    let (plain_bpt, plain_ctx) = fit(d, &[]);
    let (q8_bpt, q8_ctx) = fit(d, &["--kv-quant", "8"]);
    let (q4_bpt, q4_ctx) = fit(d, &["--kv-quant", "4"]);
    assert_eq!(plain_bpt, 2 * 2 * 64 * 2 * 2, "2 layers x 2 K/V heads x 64 x (K + V) x 2 bytes");
    assert_eq!(q8_bpt * 128, plain_bpt * 68);
    assert_eq!(q4_bpt * 128, plain_bpt * 36);
    assert!(q8_ctx > plain_ctx && q4_ctx > q8_ctx, "contexts: plain {plain_ctx}, 8-bit {q8_ctx}, 4-bit {q4_ctx}");
}

/// TurboQuant on the full-attention layers (sliding ones stay plain: the
/// quantized ring serves the affine schemes only), measured by `host kv-kl`:
/// no divergence while both runs attend plain K/V (the first chunk), some
/// after, less with more value bits, none for plain against plain.
#[test]
fn turbo_codes_full_attention_layers_and_more_bits_diverge_less() {
    let dir = model("tiny/tiny-gemma3-hd64-f32");
    let d = dir.to_str().unwrap();
    let g = generate(d, PROMPT, 8, &["--kv-quant", "turbo"]);
    let layers: Vec<&str> = g["layer_kv_schemes"].as_array().unwrap().iter().map(|s| s.as_str().unwrap()).collect();
    let turbo = "turbo:k=8,v=3,group=64,start=0";
    assert_eq!(layers, ["plain", "plain", turbo, "plain", "plain", turbo]);
    let scratch = it::Scratch::new("kv-kl");
    let text = scratch.0.join("text.txt");
    let words: Vec<String> = (0..400).map(|i| format!("w{}", (i * 7919) % 997)).collect();
    std::fs::write(&text, words.join(" ")).unwrap();
    let kl = |quant: &str| -> Value {
        host_json(&[
            "kv-kl",
            "--model",
            "models/tiny/tiny-llama-hd64-f32",
            "--text-file",
            text.to_str().unwrap(),
            "--tokens",
            "256",
            "--chunk",
            "32",
            "--kv-quant",
            quant,
        ])
    };
    let f = |v: &Value, k: &str| v[k].as_f64().unwrap_or_else(|| panic!("{k} in {v}"));
    let off = kl("off");
    assert_eq!((f(&off, "mean_kl"), f(&off, "top1_agreement")), (0.0, 1.0), "plain against plain: {off}");
    let (v2, v4) = (kl("turbo:k8v2"), kl("turbo:k8v4"));
    for v in [&v2, &v4] {
        assert_eq!(f(v, "tokens"), 256.0);
        // The first chunk attends plain K/V in both runs.
        let first = f(v, "mean_kl") * 256.0 - f(v, "mean_kl_after_the_first_chunk") * 224.0;
        assert!(first.abs() < 1e-3, "the first chunk diverged: {v}");
        assert!(f(v, "mean_kl_after_the_first_chunk") > 0.0, "{v}");
    }
    assert!(
        f(&v4, "mean_kl_after_the_first_chunk") < f(&v2, "mean_kl_after_the_first_chunk") / 2.0,
        "4-bit values should diverge far less than 2-bit ones: {v4} vs {v2}"
    );
}

/// What is not built, or cannot be, is refused at start with one line.
#[test]
fn schemes_that_cannot_be_served_are_refused_at_start() {
    let refused = |folder: &str, extra: &[&str], says: &str| {
        let out = std::process::Command::new(host_bin())
            .current_dir(it::repo_root())
            .args(["generate", "--model"])
            .arg(model(folder))
            .args(["--prompt-ids", "1,2", "--max-tokens", "2"])
            .args(extra)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{folder} {extra:?} was served");
        assert!(err.contains(says), "{folder} {extra:?}: {err}");
    };
    refused(
        "tiny/tiny-llama-hd64-f32",
        &["--paged-kv", "--kv-quant", "8"],
        "--paged-kv with --kv-quant 8 is not built",
    );
    refused("tiny/tiny-llama-hd64-f32", &["--kv-quant", "3"], "expected off, 8, 4 or turbo");
    refused("tiny/tiny-llama-hd64-f32", &["--kv-quant", "turbo:k7v3"], "keys at 2-6 or 8 bits");
    refused("tiny/tiny-llama-hd64-f32", &["--kv-quant", "8", "--kv-group-size", "48"], "32, 64 or 128");
    refused("tiny/tiny-llama-hd64-f32", &["--kv-group-size", "32"], "need --kv-quant 8, 4 or turbo");
    // Head rows of 16 are no whole number of 64-groups (mlx-lm cannot either).
    refused("tiny/tiny-llama-f32", &["--kv-quant", "8"], "cannot be quantized in groups of 64");
    // Gemma 4 hands K/V to the layers that share them: it does not attend
    // through its layouts.
    refused(
        "tiny/tiny-gemma4-f32",
        &["--kv-quant", "8"],
        "needs a model family that attends through its cache layouts",
    );
}

/// The same `--kv-budget` admits at least twice the rows under 4-bit codes:
/// eight requests of 200 + 24 tokens (one 256-token growth step each) arrive
/// together under a budget of 3.5 such rows of bf16 K/V (1024 bytes a
/// token; admission also counts a prefill's transients, so fewer run: one
/// here), which holds all eight rows of 4-bit codes (288 bytes a token).
#[test]
fn the_same_kv_budget_admits_more_rows_of_codes() {
    const ROWS: u64 = 8;
    let m = model("tiny/tiny-llama-hd64-bf16");
    let budget = format!("{}", 3.5 * 256.0 * 1024.0 / (1u64 << 30) as f64);
    let bodies: Vec<Value> = (0..ROWS)
        .map(|i| {
            let prompt: Vec<u64> = (0..200).map(|t| (t * 7919 + i * 104_729) % 4000 + 10).collect();
            json!({ "prompt": prompt, "max_tokens": 24, "temperature": 0 })
        })
        .collect();
    let most_rows = |extra: &[&str]| -> u64 {
        let flags = ["--batch", "8", "--debug-endpoints", "--prompt-cache", "0", "--kv-budget", &budget];
        let s = Server::start(&m, &[&flags[..], extra].concat());
        let out = s.post_burst("/v1/completions", &bodies);
        assert!(out.iter().all(|r| r["choices"][0]["finish_reason"] == "length"), "{out:?}");
        s.stats()["max_batch_rows"].as_u64().unwrap()
    };
    let plain = most_rows(&[]);
    let codes = most_rows(&["--kv-quant", "4"]);
    eprintln!("rows admitted under one budget: bf16 {plain}, 4-bit {codes}");
    assert!((1..=3).contains(&plain), "bf16 rows beyond the budget: {plain}");
    assert!(codes >= 2 * plain, "4-bit codes admitted {codes} rows, bf16 {plain}");
    assert_eq!(codes, ROWS, "4-bit rows were kept waiting");
}

/// A burst sharing a prefix the prefix cache holds starts its cohort from
/// the cached codes (each row's trimmed to its share, merged left-padded)
/// under every quantized scheme: one cohort, no failure, each row reporting
/// 6 - pad cached tokens. The reference is each prompt served alone after
/// the same warm request, so that it too reads the prefix from the cached
/// codes. A row padded by p recomputes p of those tokens exactly (prefill
/// runs on plain K/V) where the reference reads their codes, which moves a
/// tiny model's answer by more than rounding, so the numbers are compared
/// on the unpadded rows, which start from all 6 cached tokens, by the
/// batched-rows rule (within TOL, diverging only at a near-tie). The
/// hybrid's recurrent state cannot give up cached tokens, so its cohort
/// recomputes the prefix (0 cached).
#[test]
fn a_burst_sharing_a_cached_prefix_starts_its_cohort_from_the_cached_codes() {
    const TOL: f64 = 0.1;
    let shared: Vec<u32> = (0..6).map(|k| 5 + 2 * k).collect();
    let warm: Vec<u32> = shared.iter().copied().chain([900, 901]).collect();
    let warm = json!({ "prompt": warm, "max_tokens": 1, "temperature": 0 });
    // Suffixes of 3, 5 and 5 tokens: heads padded 2, 0 and 0.
    let prompts: Vec<Vec<u32>> = [3u32, 5, 5]
        .iter()
        .enumerate()
        .map(|(i, &n)| shared.iter().copied().chain((0..n).map(|k| 440 + 37 * i as u32 + 3 * k)).collect())
        .collect();
    let bodies: Vec<Value> =
        prompts.iter().map(|p| json!({ "prompt": p, "max_tokens": 16, "temperature": 0, "logprobs": 2 })).collect();
    for name in MODELS {
        let m = model(name);
        let recurrent = name.contains("qwen3_5");
        for kv in [["--kv-quant", "8"], ["--kv-quant", "4"], ["--kv-quant", "turbo"]] {
            let alone: Vec<Value> = {
                let s = Server::start(&m, &[&["--batch", "1"], &kv[..]].concat());
                s.post("/v1/completions", &warm).json();
                bodies.iter().map(|b| s.post("/v1/completions", b).json()).collect()
            };
            let s = Server::start(&m, &[&["--batch", "8", "--debug-endpoints"], &kv[..]].concat());
            s.post("/v1/completions", &warm).json();
            let burst = s.post_burst("/v1/completions", &bodies);
            let st = s.stats();
            assert_eq!(
                (st["cohort_prefills"].as_u64(), st["failed"].as_u64()),
                (Some(1), Some(0)),
                "{name} {kv:?}: {st}"
            );
            for (i, (a, b)) in alone.iter().zip(&burst).enumerate() {
                let what = format!("{name} {kv:?} request {i}");
                let pad = if i == 0 { 2 } else { 0 };
                let cached = if recurrent { 0 } else { 6 - pad };
                assert_eq!(b["usage"]["prompt_tokens_details"]["cached_tokens"], cached, "{what}: {b}");
                assert_eq!(b["usage"]["completion_tokens"], 16, "{what}: {b}");
                if pad == 0 && !recurrent {
                    within_tolerance(a, b, TOL, &what);
                }
            }
        }
    }
}
