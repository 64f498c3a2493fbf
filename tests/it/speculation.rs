//! Speculative decoding is lossless: greedy output with any drafter equals
//! output without one; a self-draft accepts everything; n-gram drafting on
//! a copy prompt accepts most of what it drafts; a sampled run keeps the
//! target's distribution, also when rejection sampling verifies a different
//! draft model's probabilities; a sampled self-draft accepts almost
//! everything by rejection sampling; HTTP usage reports what speculation did.

use it::{chi2_two_sample, host_bin, model, rejection_keeps_the_distribution, run_ok, Server};
use serde_json::{json, Value};

fn gen(m: &str, prompt: &[&str], extra: &[&str]) -> Value {
    let d = model(m);
    let mut cmd = std::process::Command::new(host_bin());
    cmd.current_dir(it::repo_root())
        .args(["generate", "--model"])
        .arg(&d)
        .args(prompt)
        .args(["--json", "--ignore-eos", "--dtype", "native"])
        .args(extra);
    serde_json::from_str(&run_ok(&mut cmd)).unwrap()
}

const IDS: &[&str] = &["--prompt-ids", "1,2,3,4,5,6,1,2,3,4,5,6,1,2,3", "--max-tokens", "48"];

fn tokens(v: &Value) -> Vec<u64> {
    v["tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).collect()
}

#[test]
fn greedy_output_is_identical_with_every_drafter() {
    for target in ["tiny/tiny-llama-f32", "tiny/tiny-qwen3-f32", "tiny/tiny-llama-swa-f32"] {
        let plain = gen(target, IDS, &[]);
        assert!(plain.get("speculation").is_none());
        for drafter in every_drafter(target) {
            let drafter: Vec<&str> = drafter.iter().map(String::as_str).collect();
            let spec = gen(target, IDS, &drafter);
            assert_eq!(tokens(&spec), tokens(&plain), "{target} with {drafter:?} changed the greedy output");
            let sp = &spec["speculation"];
            let refused = sp["disabled"].as_str().is_some_and(|d| d.contains("refused a speculative round"));
            if target.contains("swa") {
                // The 15-token prompt has already wrapped the window of 8:
                // kv-rotating refuses the first round, and says so.
                assert!(refused && sp["drafted"] == 0, "{target} {drafter:?}: {sp}");
            } else {
                assert!(drafted(sp), "{target} {drafter:?}: {sp}");
            }
            assert!(spec["execution"]["plan"].as_str().unwrap().starts_with("speculative"), "{}", spec["execution"]);
        }
    }
}

/// A sliding-window target whose prompt is shorter than its window: rounds
/// run (and roll the ring back, also across the wrap: n-gram's 10 drafts
/// after 4 tokens) until the window has wrapped, then kv-rotating refuses
/// them; the greedy output equals plain decoding throughout.
#[test]
fn greedy_output_is_identical_over_a_sliding_window_until_it_wraps() {
    let target = "tiny/tiny-llama-swa-f32";
    let short: &[&str] = &["--prompt-ids", "1,2,1,2", "--max-tokens", "24"];
    let plain = gen(target, short, &[]);
    for drafter in every_drafter(target) {
        let drafter: Vec<&str> = drafter.iter().map(String::as_str).collect();
        let spec = gen(target, short, &drafter);
        assert_eq!(tokens(&spec), tokens(&plain), "{drafter:?} changed the greedy output");
        let sp = &spec["speculation"];
        assert!(drafted(sp), "{drafter:?}: no round ran before the window wrapped: {sp}");
        // A model drafter drafts every round, so its first round after the
        // wrap is refused (n-gram drafts only where the history repeats).
        let refused = sp["disabled"].as_str().is_some_and(|d| d.contains("refused a speculative round"));
        assert!(refused || drafter[0] == "--draft-kind", "{drafter:?}: no round was refused after the wrap: {sp}");
    }
}

/// n-gram, the target drafting for itself, and another model (4 drafts),
/// each with --speculate-always: the counts asserted must not depend on
/// timing.
fn every_drafter(target: &str) -> [Vec<String>; 3] {
    let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let self_dir = model(target).to_string_lossy().into_owned();
    let other = model("tiny/tiny-mistral-f32").to_string_lossy().into_owned();
    [
        args(&["--draft-kind", "ngram", "--speculate-always"]),
        args(&["--draft-model", &self_dir, "--speculate-always"]),
        args(&["--draft-model", &other, "--num-draft-tokens", "4", "--speculate-always"]),
    ]
}

fn drafted(sp: &Value) -> bool {
    sp["rounds"].as_u64().unwrap() > 0 && sp["drafted"].as_u64().unwrap() > 0
}

#[test]
fn a_self_draft_accepts_everything() {
    let dir = model("tiny/tiny-llama-f32").to_string_lossy().into_owned();
    // --speculate-always: a same-size self-draft does not pay on this CPU,
    // and the cost rule would switch it off; acceptance is what is tested.
    let spec = gen("tiny/tiny-llama-f32", IDS, &["--draft-model", &dir, "--speculate-always"]);
    let sp = &spec["speculation"];
    assert!(sp["drafted"].as_u64().unwrap() >= 30, "{sp}");
    assert_eq!(sp["accepted"], sp["drafted"], "{sp}");
    assert!(sp["disabled"].is_null());
    // Every round accepted all three drafts: by position, each counts every round.
    assert_eq!(sp["accepted_by_position"], json!([sp["rounds"], sp["rounds"], sp["rounds"]]));
}

#[test]
fn a_useless_draft_falls_back_to_plain_steps_and_says_so() {
    let other = model("tiny/tiny-qwen3-f32").to_string_lossy().into_owned();
    let spec = gen("tiny/tiny-llama-f32", IDS, &["--draft-model", &other]);
    let why = spec["speculation"]["disabled"].as_str().unwrap_or_else(|| panic!("{}", spec["speculation"]));
    assert!(why.contains("acceptance") && why.contains("plain steps"), "{why}");
    assert_eq!(tokens(&spec), tokens(&gen("tiny/tiny-llama-f32", IDS, &[])), "falling back changed the output");
}

const COPY: &str = "The rules of the house:\n1. Shoes stay at the door.\n2. Dishes go in the sink after dinner.\n3. Lights are off by ten.\n4. Guests are welcome on weekends.\n\nThe rules of the house (copy):\n1. Shoes stay at the door.\n2.";

#[test]
fn ngram_on_a_copy_prompt_accepts_more_than_half_and_changes_nothing() {
    let p = ["--prompt", COPY, "--max-tokens", "40"];
    let plain = gen("smollm2-135m-instruct", &p, &[]);
    let spec = gen("smollm2-135m-instruct", &p, &["--draft-kind", "ngram", "--speculate-always"]);
    assert_eq!(tokens(&spec), tokens(&plain));
    let sp = &spec["speculation"];
    let (a, d) = (sp["accepted"].as_f64().unwrap(), sp["drafted"].as_f64().unwrap());
    assert!(d > 0.0 && a / d > 0.5, "n-gram accepted {a} of {d}: {sp}");
}

/// Two-model drafting, lossless whether its drafts are all accepted (a
/// self-draft) or some are rejected (the bf16 copy of the target, which
/// disagrees now and then).
#[test]
fn two_model_drafting_changes_nothing_with_and_without_rejections() {
    let target = "tiny/tiny-llama-f32";
    let plain = gen(target, IDS, &[]);
    let self_dir = model(target).to_string_lossy().into_owned();
    let own = gen(target, IDS, &["--draft-model", &self_dir, "--speculate-always"]);
    assert_eq!(tokens(&own), tokens(&plain));
    let sp = &own["speculation"];
    assert!(sp["drafted"].as_u64().unwrap() > 0 && sp["accepted"] == sp["drafted"], "{sp}");
    let bf16 = model("tiny/tiny-llama-bf16").to_string_lossy().into_owned();
    let other = gen(target, IDS, &["--draft-model", &bf16, "--num-draft-tokens", "4", "--speculate-always"]);
    assert_eq!(tokens(&other), tokens(&plain), "{}", other["speculation"]);
    let sp = &other["speculation"];
    assert!(sp["drafted"].as_u64().unwrap() > 0, "{sp}");
}

/// The default model drafting for itself (two-model), serial and inside
/// the batch (two requests at once, each row with its own drafter): the
/// greedy output is unchanged and drafts are accepted.
#[test]
fn the_default_model_drafting_for_itself_changes_nothing_serial_or_batched() {
    let m = model("smollm2-135m-instruct");
    let dir = m.to_string_lossy().into_owned();
    let p = ["--prompt", COPY, "--max-tokens", "24"];
    let plain = gen("smollm2-135m-instruct", &p, &[]);
    let spec = gen("smollm2-135m-instruct", &p, &["--draft-model", &dir, "--speculate-always"]);
    assert_eq!(tokens(&spec), tokens(&plain), "serial two-model changed the output");
    assert!(spec["speculation"]["accepted"].as_u64().unwrap() > 0, "{}", spec["speculation"]);

    let body = json!({ "prompt": COPY, "max_tokens": 24, "temperature": 0 });
    let want = Server::start(&m, &["--batch", "1"]).post("/v1/completions", &body).json();
    let s = Server::start(&m, &["--batch", "4", "--draft-model", &dir, "--speculate-always", "--debug-endpoints"]);
    let got = s.post_burst("/v1/completions", &[body.clone(), body.clone()]);
    assert!(s.stats()["max_batch_rows"].as_u64().unwrap() >= 2, "the two requests never shared a step: {}", s.stats());
    for g in &got {
        assert_eq!(g["choices"][0]["text"], want["choices"][0]["text"], "batched two-model changed the output");
        let sp = &g["usage"]["speculation"];
        assert!(sp["kind"] == "two-model" && sp["accepted"].as_u64().unwrap() > 0, "{sp}");
    }
}

/// A prompt id outside the vocabulary is refused on the speculative path
/// as on the plain one (it once reached the model there and generated).
#[test]
fn a_prompt_id_outside_the_vocabulary_is_refused_with_a_drafter_too() {
    for extra in [&[][..], &["--draft-kind", "ngram"][..]] {
        let out = std::process::Command::new(host_bin())
            .current_dir(it::repo_root())
            .args(["generate", "--model"])
            .arg(model("tiny/tiny-llama-f32"))
            .args(["--prompt-ids", "1,2,99999999", "--max-tokens", "2"])
            .args(extra)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains("outside the vocabulary"), "{extra:?}: {err}");
    }
}

#[test]
fn a_draft_model_with_another_tokenizer_is_refused_at_start_up() {
    let dir = it::Scratch::new("badtok");
    let src = model("tiny/tiny-llama-f32");
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(src.join(f), dir.0.join(f)).unwrap();
    }
    // Same tokens and size, two ids swapped: it loads, but encodes differently.
    let mut tok: Value = serde_json::from_str(&std::fs::read_to_string(src.join("tokenizer.json")).unwrap()).unwrap();
    let vocab = tok["model"]["vocab"].as_object_mut().unwrap();
    let (a, b) = (vocab["()"].clone(), vocab["Ġloc"].clone());
    vocab.insert("()".into(), b);
    vocab.insert("Ġloc".into(), a);
    std::fs::write(dir.0.join("tokenizer.json"), tok.to_string()).unwrap();
    let out = std::process::Command::new(host_bin())
        .current_dir(it::repo_root())
        .args(["generate", "--model"])
        .arg(&src)
        .args(["--prompt-ids", "1,2", "--max-tokens", "2", "--draft-model"])
        .arg(&dir.0)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("tokenizer") && err.contains("differs"), "{err}");
}

/// Chi-square two-sample test on the joint outcome of the first two sampled
/// tokens (top_k 3 at temperature 1: 9 cells), 300 seeds per arm. With the
/// seeds fixed the test is deterministic; the critical value is the
/// chi-square quantile at 99.9% (z = 3.09, Wilson-Hilferty), so a correct
/// sampler fails it with probability 0.001 over the choice of seeds.
#[test]
fn sampled_speculation_keeps_the_target_distribution() {
    let m = model("tiny/tiny-llama-f32");
    let self_dir = m.to_string_lossy().into_owned();
    let plain = Server::start(&m, &["--batch", "1"]);
    let spec = Server::start(
        &m,
        &["--batch", "1", "--draft-model", &self_dir, "--num-draft-tokens", "2", "--speculate-always"],
    );
    let sample = |s: &Server, seed: u64| -> (u64, u64, Value) {
        let r = s.post("/v1/completions", &json!({ "prompt": [1, 2, 3], "max_tokens": 2, "temperature": 1.0, "top_k": 3, "seed": seed, "logprobs": 0 })).json();
        let toks = r["choices"][0]["logprobs"]["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap().to_owned())
            .collect::<Vec<_>>();
        let h = |s: &str| s.bytes().fold(0u64, |a, b| a.wrapping_mul(131).wrapping_add(b as u64));
        (h(&toks[0]), h(&toks[1]), r["usage"].clone())
    };
    let n = 300;
    let mut counts: std::collections::BTreeMap<(u64, u64), [f64; 2]> = Default::default();
    let mut drafted = 0;
    for seed in 0..n {
        let (a, b, _) = sample(&plain, seed);
        counts.entry((a, b)).or_default()[0] += 1.0;
        let (a, b, u) = sample(&spec, 10_000 + seed);
        counts.entry((a, b)).or_default()[1] += 1.0;
        drafted += u["speculation"]["drafted"].as_u64().unwrap_or(0);
    }
    assert!(drafted > 0, "speculation never drafted");
    assert!(counts.len() > 1, "the sampler never varied");
    let pairs: Vec<[f64; 2]> = counts.values().copied().collect();
    let (chi2, crit) = chi2_two_sample(&pairs);
    assert!(chi2 < crit, "distributions differ: chi2 {chi2:.1} >= {crit:.1}; counts {counts:?}");
}

#[test]
fn http_usage_reports_speculation_and_output_is_unchanged() {
    let m = model("smollm2-135m-instruct");
    let plain = Server::start(&m, &["--batch", "1"]);
    let spec = Server::start(&m, &["--draft-kind", "ngram", "--speculate-always"]);
    let body = json!({ "prompt": COPY, "max_tokens": 30, "temperature": 0 });
    let a = plain.post("/v1/completions", &body).json();
    let b = spec.post("/v1/completions", &body).json();
    assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"]);
    let sp = &b["usage"]["speculation"];
    for k in ["drafted", "accepted", "rounds", "accepted_by_position"] {
        assert!(!sp[k].is_null(), "usage.speculation lacks {k}: {sp}");
    }
    assert!(sp["drafted"].as_u64().unwrap() > 0, "nothing was drafted: {sp}");
    assert!(a["usage"].get("speculation").is_none());
}

/// The resolved plan is what runs, and the log says so: a request with a
/// repetition penalty cannot speculate (a token's penalty needs the token
/// before it), so it decodes plainly, reports no speculation and its plan
/// gives the reason; a request with logprobs speculates (the host reads the
/// logprobs off the verify's logits) and its logprobs equal plain decoding's.
#[test]
fn the_plan_decides_whether_a_request_speculates() {
    let m = model("smollm2-135m-instruct");
    let plain = Server::start(&m, &["--batch", "1"]);
    let spec = Server::start(&m, &["--draft-kind", "ngram"]);
    let penalised = json!({ "prompt": COPY, "max_tokens": 12, "temperature": 0, "repetition_penalty": 1.3 });
    let (a, b) = (plain.post("/v1/completions", &penalised).json(), spec.post("/v1/completions", &penalised).json());
    assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"]);
    assert!(b["usage"].get("speculation").is_none(), "a penalised request speculated: {}", b["usage"]);
    let log = std::fs::read_to_string(&spec.log).unwrap();
    assert!(
        log.contains("plan=autoregressive")
            && log.contains("speculation disabled for repetition, presence and frequency penalties"),
        "{log}"
    );
    let with_lp = json!({ "prompt": COPY, "max_tokens": 20, "temperature": 0, "logprobs": 2 });
    let (a, b) = (plain.post("/v1/completions", &with_lp).json(), spec.post("/v1/completions", &with_lp).json());
    assert!(b["usage"]["speculation"]["drafted"].as_u64().unwrap() > 0, "{}", b["usage"]);
    let (la, lb) = (&a["choices"][0]["logprobs"], &b["choices"][0]["logprobs"]);
    assert_eq!(la["tokens"], lb["tokens"]);
    for (x, y) in la["token_logprobs"].as_array().unwrap().iter().zip(lb["token_logprobs"].as_array().unwrap()) {
        assert!((x.as_f64().unwrap() - y.as_f64().unwrap()).abs() < 1e-4, "logprob {x} plain vs {y} speculative");
    }
    assert!(
        std::fs::read_to_string(&spec.log).unwrap().contains("plan=speculative"),
        "the logprobs request's plan is not speculative"
    );
}

/// A stop string that matches inside a speculative round (served serially),
/// streamed and not: the text ends where the plain server's does, the rest
/// of the round is dropped, and the next request on the same server (its
/// prefix cache holding the stopped request's caches) still answers as the
/// plain server does.
#[test]
fn a_stop_string_inside_a_speculative_round_ends_the_text_where_plain_decoding_does() {
    let m = model("smollm2-135m-instruct");
    let plain = Server::start(&m, &["--batch", "1"]);
    let spec =
        Server::start(&m, &["--batch", "1", "--draft-kind", "ngram", "--num-draft-tokens", "4", "--speculate-always"]);
    let body = json!({ "prompt": COPY, "max_tokens": 40, "temperature": 0, "stop": ["Guests"] });
    let want = plain.post("/v1/completions", &body).json();
    assert_eq!(want["choices"][0]["finish_reason"], "stop", "{want}");
    let got = spec.post("/v1/completions", &body).json();
    assert_eq!(got["choices"][0]["text"], want["choices"][0]["text"]);
    assert_eq!(got["choices"][0]["finish_reason"], "stop");
    assert!(got["usage"]["speculation"]["drafted"].as_u64().unwrap() > 0, "nothing was drafted: {}", got["usage"]);
    let streamed = spec.post(
        "/v1/completions",
        &json!({ "prompt": COPY, "max_tokens": 40, "temperature": 0, "stop": ["Guests"], "stream": true }),
    );
    let text: String = streamed
        .text()
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str::<Value>(d).unwrap()["choices"][0]["text"].as_str().unwrap_or("").to_owned())
        .collect();
    assert_eq!(text, want["choices"][0]["text"].as_str().unwrap());
    let next = json!({ "prompt": format!("{COPY}{}", want["choices"][0]["text"].as_str().unwrap()), "max_tokens": 12, "temperature": 0 });
    assert_eq!(
        spec.post("/v1/completions", &next).json()["choices"][0]["text"],
        plain.post("/v1/completions", &next).json()["choices"][0]["text"]
    );
}

/// Rejection sampling keeps the target's distribution with a draft model
/// whose distribution differs: the joint outcome of three sampled tokens
/// (top_k 3 at temperature 1: 27 cells, two drafts then the bonus or a
/// plain step), 400 seeds per arm, chi-square at 99.9% against plain
/// sampling. tiny-llama-q4 shares part of the target's top 3 (drafts are
/// accepted and rejected); tiny-mistral-f32 shares none of it (every draft
/// is rejected and the residual draw carries the round).
#[test]
fn rejection_sampling_with_another_draft_model_keeps_the_target_distribution() {
    let m = model("tiny/tiny-llama-f32");
    let plain = Server::start(&m, &["--batch", "1"]);
    let drafts = ["tiny/tiny-llama-q4", "tiny/tiny-mistral-f32"].map(|d| {
        let dir = model(d).to_string_lossy().into_owned();
        (
            d,
            Server::start(
                &m,
                &["--batch", "1", "--draft-model", &dir, "--num-draft-tokens", "2", "--speculate-always"],
            ),
        )
    });
    let sample = |s: &Server, seed: u64| -> (Vec<String>, Value) {
        let r = s.post("/v1/completions", &json!({ "prompt": [1, 2, 3], "max_tokens": 3, "temperature": 1.0, "top_k": 3, "seed": seed, "logprobs": 0 })).json();
        let toks = r["choices"][0]["logprobs"]["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap().to_owned())
            .collect();
        (toks, r["usage"]["speculation"].clone())
    };
    for (name, spec) in &drafts {
        let (drafted, accepted) = rejection_keeps_the_distribution(&plain, spec, 400, sample, name);
        assert!(accepted < drafted, "{name}: no draft was rejected ({accepted} of {drafted})");
        if *name == "tiny/tiny-llama-q4" {
            assert!(accepted > 0, "{name}: overlapping supports should accept some drafts (0 of {drafted})");
        }
    }
}

/// p == q up to rounding: a self-draft at temperature 1 accepts (almost)
/// everything by rejection sampling, where exact match of the target's own
/// samples would accept a draft d with probability p(d) only (for these
/// flat tiny models, well under 10%: the mean probability of the emitted
/// tokens). Drafts without probabilities still verify by exact match.
#[test]
fn a_self_draft_at_temperature_1_accepts_almost_everything_by_rejection_sampling() {
    let dir = model("tiny/tiny-llama-f32").to_string_lossy().into_owned();
    let sampled = ["--temp", "1", "--seed", "7", "--logprobs", "1"];
    let spec =
        gen("tiny/tiny-llama-f32", IDS, &[&sampled[..], &["--draft-model", &dir, "--speculate-always"]].concat());
    let sp = &spec["speculation"];
    assert_eq!(sp["rejection_sampling"], true, "{sp}");
    assert!(sp["drafted"].as_u64().unwrap() >= 30 && sp["disabled"].is_null(), "{sp}");
    assert!(sp["acceptance"].as_f64().unwrap() > 0.9, "{sp}");
    let lps = spec["logprobs"].as_array().unwrap();
    let exact_match = lps.iter().map(|l| l["logprob"].as_f64().unwrap().exp()).sum::<f64>() / lps.len() as f64;
    assert!(exact_match < 0.1, "expected exact-match acceptance {exact_match}");
    let ngram = gen("tiny/tiny-llama-f32", IDS, &[&sampled[..], &["--draft-kind", "ngram"]].concat());
    assert_eq!(ngram["speculation"]["rejection_sampling"], false, "{}", ngram["speculation"]);
}
