//! Drafters checked round by round against a reference loop: drafter
//! plugins write one JSON line per round when given the option
//! `trace=<file>` (`drafts`, `accepted`, `logits` each draft was chosen
//! from, optionally `confidence`); oracle scripts write the reference's
//! rounds in the same shape.

use crate::{host_bin, python, repo_root, run_ok, Scratch};
use serde_json::Value;
use std::path::Path;

/// `|a - b| <= ATOL + RTOL |b|`, as the f32 parity tests.
pub const ATOL: f64 = 1e-4;
pub const RTOL: f64 = 1e-4;

pub struct Round {
    pub drafts: Vec<u64>,
    pub accepted: u64,
    pub logits: Vec<Vec<f64>>,
    pub confidence: Vec<f64>,
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array().map(|a| a.iter().map(|x| x.as_f64().unwrap()).collect()).unwrap_or_default()
}

pub fn ids(v: &Value) -> Vec<u64> {
    v.as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).collect()
}

pub fn round(v: &Value) -> Round {
    Round {
        drafts: ids(&v["drafts"]),
        accepted: v["accepted"].as_u64().unwrap(),
        logits: v["logits"].as_array().unwrap().iter().map(floats).collect(),
        confidence: floats(&v["confidence"]),
    }
}

pub fn rounds(v: &Value) -> Vec<Round> {
    v.as_array().unwrap().iter().map(round).collect()
}

/// `host generate` on prompt ids, greedy, a fixed length, JSON out.
pub fn generate(target: &Path, prompt: &str, max_tokens: usize, extra: &[&str]) -> std::process::Output {
    std::process::Command::new(host_bin())
        .current_dir(repo_root())
        .args(["generate", "--model"])
        .arg(target)
        .args(["--prompt-ids", prompt, "--max-tokens", &max_tokens.to_string(), "--ignore-eos", "--json"])
        .args(extra)
        .output()
        .unwrap()
}

pub fn generate_ok(target: &Path, prompt: &str, max_tokens: usize, extra: &[&str]) -> Value {
    let out = generate(target, prompt, max_tokens, extra);
    assert!(out.status.success(), "host generate {extra:?} failed:\n{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Speculates with the drafter `source` names (always, every round traced).
pub fn speculate(target: &Path, prompt: &str, max_tokens: usize, source: &[&str], trace: &Path) -> (Value, Vec<Round>) {
    let _ = std::fs::remove_file(trace);
    let option = format!("trace={}", trace.display());
    let mut extra = source.to_vec();
    extra.extend(["--speculate-always", "--draft-option", &option]);
    let out = generate_ok(target, prompt, max_tokens, &extra);
    let text = std::fs::read_to_string(trace).unwrap_or_default();
    let lines = text.lines().map(|l| round(&serde_json::from_str(l).unwrap())).collect();
    (out, lines)
}

/// How a round the budget cut short compares with the reference's round
/// at its index (the reference runs a few tokens longer).
#[derive(Clone, Copy, PartialEq)]
/// Either way a round may be short only where the request's `max_tokens`
/// left room for no more (its drafts plus the token it verifies fill what
/// is left), so a drafter that drafts too few anywhere else fails.
pub enum ShortRounds {
    /// Its drafts and logits are the reference's first ones (a drafter
    /// whose steps do not see the round's width).
    Prefix { max_tokens: usize },
    /// Not comparable: a block drafter's width changes every slot's output.
    /// Only the count is checked.
    Unchecked { max_tokens: usize },
}

pub fn close(a: &[f64], b: &[f64]) -> Option<(f64, f64)> {
    assert_eq!(a.len(), b.len(), "lengths differ");
    a.iter().zip(b).find(|(x, y)| (*x - *y).abs() > ATOL + RTOL * y.abs()).map(|(x, y)| (*x, *y))
}

/// Our rounds against the reference's, index by index. Rounds the budget
/// cut short may only come last.
pub fn same_rounds(ours: &[Round], reference: &[Round], short: ShortRounds, what: &str) {
    assert!(!ours.is_empty(), "{what}: the drafter traced no rounds");
    assert!(ours.len() <= reference.len(), "{what}: {} rounds, the reference ran {}", ours.len(), reference.len());
    let mut cut = false;
    // Tokens out before the round: the prompt's first, then each round's
    // accepted drafts and the token after them.
    let mut emitted = 1;
    for (i, (o, r)) in ours.iter().zip(reference).enumerate() {
        let k = o.drafts.len();
        assert!(k >= 1 && k <= r.drafts.len(), "{what} round {i}: {k} drafts, the reference drafted {:?}", r.drafts);
        let before = emitted;
        emitted += o.accepted as usize + 1;
        if k < r.drafts.len() {
            cut = true;
            let (ShortRounds::Prefix { max_tokens } | ShortRounds::Unchecked { max_tokens }) = short;
            let room = max_tokens.saturating_sub(before + 1);
            assert_eq!(k, room, "{what} round {i}: {k} drafts where the budget left room for {room}");
            if let ShortRounds::Unchecked { .. } = short {
                continue;
            }
        } else {
            assert!(!cut, "{what} round {i}: a full round after one the budget cut short");
        }
        assert_eq!(o.drafts, r.drafts[..k], "{what} round {i}: drafts");
        assert_eq!(o.accepted, r.accepted.min(k as u64), "{what} round {i}: accepted of {:?}", o.drafts);
        assert_eq!(o.logits.len(), k, "{what} round {i}: one logits row per draft step");
        for (step, (a, b)) in o.logits.iter().zip(&r.logits).enumerate() {
            let bad = close(a, b);
            assert!(bad.is_none(), "{what} round {i} step {step}: logits {bad:?} (ours, reference)");
        }
        if !r.confidence.is_empty() {
            let bad = close(&o.confidence, &r.confidence);
            assert!(bad.is_none(), "{what} round {i}: confidence {bad:?} (ours, reference)");
        }
    }
}

/// Prompts of mixed lengths (ids below 90), as completions bodies: greedy,
/// staggered lengths; every third request asks for a frequency penalty,
/// which plans it plain, so drafting and plain rows share the batch.
pub fn mixed_bodies() -> Vec<Value> {
    let prompts: [&[u32]; 6] = [
        &[5, 17, 33, 8, 41, 60, 22, 9],
        &[12, 13],
        &[70, 71, 72, 70, 71],
        &[3, 44, 3, 44, 3, 44, 3, 44, 3, 44, 3, 44],
        &[88],
        &[20, 21, 22, 23],
    ];
    prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let mut b = serde_json::json!({"prompt": p, "max_tokens": 16 + 3 * i, "temperature": 0});
            if i % 3 == 2 {
                b["frequency_penalty"] = serde_json::json!(0.5);
            }
            b
        })
        .collect()
}

/// Greedy requests through a batching server with the drafter `spec_args`
/// name (arriving while others decode, twice: the second time from the
/// prefix cache) answer as a plain serial server does; returns the drafted
/// and accepted totals of the speculating rows.
pub fn batched_matches_serial(target: &Path, spec_args: &[&str], what: &str) -> (u64, u64) {
    let bodies = mixed_bodies();
    let want: Vec<Value> = {
        let s = crate::Server::start(target, &["--batch", "1"]);
        bodies.iter().map(|b| s.post("/v1/completions", b).json()).collect()
    };
    let mut args = vec!["--batch", "8", "--speculate-always", "--debug-endpoints"];
    args.extend(spec_args);
    let s = crate::Server::start(target, &args);
    let (mut drafted, mut accepted, mut cached) = (0, 0, 0);
    for pass in ["cold", "from the prefix cache"] {
        let got = s.post_joining("/v1/completions", &bodies, 3);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                g["choices"][0]["text"], w["choices"][0]["text"],
                "{what} ({pass}): request {i} changed in the batch"
            );
            let sp = &g["usage"]["speculation"];
            if bodies[i].get("frequency_penalty").is_some() {
                assert!(sp.is_null(), "{what} ({pass}): request {i} has a penalty and still speculated: {sp}");
                continue;
            }
            assert!(sp["disabled"].is_null(), "{what} ({pass}): request {i} stopped speculating: {sp}");
            drafted += sp["drafted"].as_u64().unwrap();
            accepted += sp["accepted"].as_u64().unwrap();
            cached += g["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0);
        }
    }
    assert!(cached > 0, "{what}: no speculating row started from the prefix cache");
    let st = s.stats();
    assert!(st["max_batch_rows"].as_u64().unwrap() >= 2, "{what}: rows never shared a step: {st}");
    (drafted, accepted)
}

/// Runs `models/scripts/<script>` into `dir` (its model folders and
/// reference.json) for greedy decoding of `prompt`, and reads the reference.
pub fn run_oracle(script: &str, dir: &Path, prompt: &str, max_tokens: usize) -> Value {
    run_oracle_with(script, dir, prompt, max_tokens, &[])
}

/// `run_oracle` with the script's further arguments.
pub fn run_oracle_with(script: &str, dir: &Path, prompt: &str, max_tokens: usize, extra: &[&str]) -> Value {
    let script = repo_root().join("models/scripts").join(script);
    let summary = run_ok(python().arg(script).arg(dir).arg(prompt).arg(max_tokens.to_string()).args(extra));
    eprintln!("oracle: {}", summary.trim());
    serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap()).unwrap()
}

/// A copy of the drafter folder `drafter` with its config and tensors
/// changed by `edit` (Python over `cfg` and `w`), then the one line the host
/// refuses it with when `target` starts with it (the stderr lines naming one
/// of `names`).
pub fn refusal(target: &Path, drafter: &Path, edit: &str, names: &[&str]) -> String {
    let bad = edited(drafter, edit);
    let out = generate(target, "1,2,3", 4, &["--draft-model", bad.0.to_str().unwrap()]);
    assert!(!out.status.success(), "{edit}: the host started with a mismatched drafter");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let lines: Vec<&str> = err.lines().filter(|l| names.iter().any(|n| l.contains(n))).collect();
    assert_eq!(lines.len(), 1, "{edit}: not one line naming the mismatch:\n{err}");
    lines[0].to_owned()
}

/// A copy of the drafter folder `drafter` (config.json, model.safetensors)
/// with `edit` applied: Python over `cfg` (the config) and `w` (the tensors).
pub fn edited(drafter: &Path, edit: &str) -> Scratch {
    let script = "import sys, json, mlx.core as mx\n\
        d, edit = sys.argv[1], sys.argv[2]\n\
        cfg = json.load(open(d + '/config.json'))\n\
        w = mx.load(d + '/model.safetensors')\n\
        exec(edit)\n\
        json.dump(cfg, open(d + '/config.json', 'w'))\n\
        mx.save_safetensors(d + '/model.safetensors', w)";
    let copy = Scratch::new("drafter-edited");
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(drafter.join(f), copy.0.join(f)).unwrap();
    }
    run_ok(python().args(["-c", script]).arg(&copy.0).arg(edit));
    copy
}

/// The cost rule on a drafter made useless by `edit` (its final norm
/// negated: it drafts the tokens it ranks last): without
/// `--speculate-always` the request falls back to plain steps, says so,
/// and its output is plain greedy's.
pub fn useless_drafter_falls_back(target: &Path, prompt: &str, drafter: &Path, edit: &str, plain: &[u64], what: &str) {
    let bad = edited(drafter, edit);
    let out = generate_ok(target, prompt, plain.len(), &["--draft-model", bad.0.to_str().unwrap()]);
    assert_eq!(ids(&out["tokens"]), plain, "{what}: falling back changed the output");
    let sp = &out["speculation"];
    let why = sp["disabled"].as_str().unwrap_or_else(|| panic!("{what}: still speculating: {sp}"));
    assert!(why.contains("plain steps"), "{what}: {why}");
    assert!(sp["drafted"].as_u64() > Some(0) && sp["accepted"].as_u64() < sp["drafted"].as_u64(), "{what}: {sp}");
}

/// Four tokens sampled (temperature 1, top_k 2: 16 joint outcomes) after a
/// fixed prompt of ids below 90 from the word-level oracle targets (token
/// `tN` is id N), and the answer's `usage.speculation`.
pub fn sample_four(s: &crate::Server, seed: u64) -> (Vec<u64>, Value) {
    let body = serde_json::json!({"prompt": [5, 17, 33, 8], "max_tokens": 4, "temperature": 1.0, "top_k": 2,
        "seed": seed, "logprobs": 0});
    let r = s.post("/v1/completions", &body).json();
    let tokens = r["choices"][0]["logprobs"]["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap()[1..].parse().unwrap())
        .collect();
    (tokens, r["usage"]["speculation"].clone())
}
