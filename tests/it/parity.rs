//! Numerical parity with the oracle, mlx-lm 0.32.2 on the same MLX 0.32.4:
//! greedy tokens identical, last-position logits within tolerance, for every
//! model type the first family claims (f32, bf16, 4-bit) and for the real
//! default model.
//!
//! Tolerances for `prompt_last_logits` (the oracle's full forward; ours
//! computes the LM head on the last position only, a different matmul shape)
//! and for every decode step's log-probabilities (the chosen token's and the
//! top 5, against what mlx-lm's sampler argmaxed at that step): f32
//! |a-b| <= 1e-4 + 1e-4|b| (accumulation order only); bf16 and quantized
//! models (bf16 activations) |a-b| <= 0.05 + 0.02|b|, i.e. a few bf16 ulps
//! (2^-8 relative) of an output rounded through 8-bit mantissas. A NaN or an
//! infinity on either side is a failure, never a pass.

use it::{host_bin, model, python, run_ok, Scratch};
use serde_json::Value;
use std::process::Command;

const PROMPT: &str = "1,2,3,4,5";

pub(crate) fn oracle(dir: &std::path::Path, args: &[&str]) -> Value {
    let s = Scratch::new("oracle");
    let out = s.0.join("ref.json");
    run_ok(
        python()
            .arg(it::repo_root().join("models/scripts/oracle.py"))
            .arg("--model")
            .arg(dir)
            .args(args)
            .arg("--out")
            .arg(&out),
    );
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    // Same runtime as the engine, so differences are ours, not MLX's.
    let ours = std::fs::canonicalize(it::repo_root().join(".mlx/lib/libmlx.so")).unwrap();
    let libs: Vec<std::path::PathBuf> =
        v["libmlx"].as_array().unwrap().iter().map(|p| std::fs::canonicalize(p.as_str().unwrap()).unwrap()).collect();
    assert_eq!(libs, vec![ours], "the oracle did not run on the engine's libmlx");
    v
}

pub(crate) fn host_json(args: &[&str]) -> Value {
    let out = run_ok(Command::new(host_bin()).current_dir(it::repo_root()).args(args));
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("host printed no JSON ({e}): {out}"))
}

pub(crate) fn ids(v: &Value) -> Vec<u64> {
    v.as_array().expect("array").iter().map(|x| x.as_u64().unwrap()).collect()
}

pub(crate) fn floats(v: &Value) -> Vec<f64> {
    v.as_array().expect("array").iter().map(|x| x.as_f64().unwrap_or(f64::NAN)).collect()
}

/// Greedy 64 tokens and last-prompt logits of one tiny folder vs mlx-lm.
pub(crate) fn check(name: &str) {
    check_prompt(name, PROMPT);
}

/// [`check`] with another prompt (comma-separated ids).
pub(crate) fn check_prompt(name: &str, prompt: &str) {
    let dir = model(&format!("tiny/{name}"));
    let d = dir.to_str().unwrap();
    let r = oracle(&dir, &["--prompt-ids", prompt, "--max-tokens", "64"]);
    let ours = host_json(&[
        "generate",
        "--model",
        d,
        "--prompt-ids",
        prompt,
        "--max-tokens",
        "64",
        "--ignore-eos",
        "--dtype",
        "native",
        "--logprobs",
        "5",
        "--json",
    ]);
    let (want, got) = (ids(&r["tokens"]), ids(&ours["tokens"]));
    assert_eq!(want.len(), 64);
    if want != got {
        let i = want.iter().zip(&got).position(|(a, b)| a != b).unwrap_or(want.len().min(got.len()));
        panic!(
            "{name}: greedy tokens diverge from mlx-lm at step {i}: ours {:?} vs mlx-lm {:?}\noracle top-5 there: {}",
            &got[i..(i + 3).min(got.len())],
            &want[i..(i + 3).min(want.len())],
            r["step_logits_top"][i]
        );
    }
    let low_precision = !name.ends_with("-f32");
    let tol = if low_precision { (0.05, 0.02) } else { (1e-4, 1e-4) };
    let logits = host_json(&["logits", "--model", d, "--prompt-ids", prompt, "--dtype", "native"]);
    let (a, b) = (floats(&logits["logits"]), floats(&r["prompt_last_logits"]));
    assert_eq!(a.len(), b.len(), "{name}: vocab sizes differ");
    assert_close(&a, &b, tol, &format!("{name}: last prompt position's logits"));
    // Every decode step: the chosen token's log-probability and the top 5
    // (values; ids may swap where two are within the tolerance).
    let steps = ours["logprobs"].as_array().expect("generate --logprobs gives logprobs");
    let want_steps = r["step_logprobs_top"].as_array().unwrap();
    assert_eq!(steps.len(), want_steps.len(), "{name}: one logprob entry per step");
    for (i, (s, w)) in steps.iter().zip(want_steps).enumerate() {
        let want_top = floats(&w["logprobs"]);
        let top: Vec<f64> = s["top"].as_array().unwrap().iter().map(|p| p[1].as_f64().unwrap_or(f64::NAN)).collect();
        let chosen = s["logprob"].as_f64().unwrap_or(f64::NAN);
        assert_close(&top, &want_top, tol, &format!("{name}: step {i}'s top-5 log-probabilities"));
        assert_close(&[chosen], &want_top[..1], tol, &format!("{name}: step {i}'s chosen token's log-probability"));
    }
}

/// Every `a[i]` within `atol + rtol|b[i]|` of `b[i]`; a NaN or an infinity
/// anywhere fails (a comparison with NaN is false, so a max over
/// differences would silently drop it).
pub(crate) fn assert_close(a: &[f64], b: &[f64], (atol, rtol): (f64, f64), what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths differ");
    assert!(!a.is_empty(), "{what}: nothing to compare");
    if let Some(i) = a.iter().chain(b).position(|x| !x.is_finite()) {
        panic!("{what}: a value is not finite (index {i} of ours then mlx-lm's)");
    }
    // (Every value is finite here, so `>` is the exact negation of "close".)
    let bad = a.iter().zip(b).position(|(x, y)| (x - y).abs() > atol + rtol * y.abs());
    if let Some(i) = bad {
        let max_diff = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
        panic!(
            "{what}: differs from mlx-lm at {i} ({} vs {}; up to {max_diff}, tolerance {atol} + {rtol}|b|)",
            a[i], b[i]
        );
    }
}

#[test]
fn the_comparison_fails_on_nan_and_on_a_difference() {
    let tol = (1e-4, 1e-4);
    assert_close(&[1.0, -2.0], &[1.00005, -2.0001], tol, "close");
    for (a, b) in [(vec![f64::NAN, 1.0], vec![0.0, 1.0]), (vec![0.0], vec![f64::NAN]), (vec![0.0, 1.0], vec![0.0, 1.1])]
    {
        let r = std::panic::catch_unwind(|| assert_close(&a, &b, tol, "bad"));
        assert!(r.is_err(), "{a:?} vs {b:?} passed");
    }
}

macro_rules! parity {
    ($($test:ident => $name:literal,)*) => { $( #[test] fn $test() { check($name); } )* };
}

parity! {
    llama_f32 => "tiny-llama-f32",
    llama_bf16 => "tiny-llama-bf16",
    llama_q4 => "tiny-llama-q4",
    llama_q8_group32 => "tiny-llama-q8g32",
    llama3_rope_scaling_f32 => "tiny-llama3-f32",
    llama3_rope_scaling_bf16 => "tiny-llama3-bf16",
    llama3_rope_scaling_q4 => "tiny-llama3-q4",
    mistral_f32 => "tiny-mistral-f32",
    mistral_bf16 => "tiny-mistral-bf16",
    mistral_q4 => "tiny-mistral-q4",
    qwen2_f32 => "tiny-qwen2-f32",
    qwen2_bf16 => "tiny-qwen2-bf16",
    qwen2_q4 => "tiny-qwen2-q4",
    qwen3_f32 => "tiny-qwen3-f32",
    qwen3_bf16 => "tiny-qwen3-bf16",
    qwen3_q4 => "tiny-qwen3-q4",
    smollm3_f32 => "tiny-smollm3-f32",
    smollm3_bf16 => "tiny-smollm3-bf16",
    smollm3_q4 => "tiny-smollm3-q4",
    // Sliding-window layers (window 8, kv-rotating): the 5-token prompt and
    // 64 generated tokens wrap the ring many times.
    llama_sliding_window_f32 => "tiny-llama-swa-f32",
    llama_sliding_window_bf16 => "tiny-llama-swa-bf16",
    llama_sliding_window_q4 => "tiny-llama-swa-q4",
    // Gemma 3 (model-gemma3): 6 layers, every 3rd global (linear rope
    // scaling), the others sliding over a window of 8 (kv-rotating).
    gemma3_f32 => "tiny-gemma3-f32",
    gemma3_bf16 => "tiny-gemma3-bf16",
    gemma3_q4 => "tiny-gemma3-q4",
}

/// A prompt longer than the window (40 ids, window 8): the prefill itself
/// goes past the window (mlx-lm's multi-token concat path and an explicit
/// window mask), the logits forward attends through a 40x40 window mask, and
/// the first decode step cuts the 39-token storage down to the ring.
#[test]
fn sliding_window_prompts_longer_than_the_window() {
    let prompt: Vec<String> = (0..40u64).map(|i| ((i * 7919) % 49000 + 10).to_string()).collect();
    let prompt = prompt.join(",");
    for name in ["tiny-llama-swa-f32", "tiny-llama-swa-bf16", "tiny-gemma3-f32", "tiny-gemma3-bf16"] {
        check_prompt(name, &prompt);
    }
}

#[test]
fn default_model_answers_like_mlx_lm_on_a_chat_prompt() {
    let dir = model("smollm2-135m-instruct");
    let d = dir.to_str().unwrap();
    let chat = "What is the capital of France?";
    let r = oracle(&dir, &["--chat", chat, "--max-tokens", "24"]);
    let ours = host_json(&[
        "generate",
        "--model",
        d,
        "--chat",
        chat,
        "--max-tokens",
        "24",
        "--ignore-eos",
        "--dtype",
        "native",
        "--json",
    ]);
    assert_eq!(ids(&ours["prompt_tokens"]), ids(&r["prompt_ids"]), "chat template or tokenizer differs from mlx-lm");
    assert_eq!(ids(&ours["tokens"]), ids(&r["tokens"]), "greedy continuation differs from mlx-lm");
    let text = ours["text"].as_str().unwrap();
    assert!(text.contains("Paris"), "{text}");
}

#[test]
fn cpu_auto_dtype_is_float32_and_says_why() {
    let d = model("tiny/tiny-qwen3-bf16");
    let ours =
        host_json(&["generate", "--model", d.to_str().unwrap(), "--prompt-ids", PROMPT, "--max-tokens", "4", "--json"]);
    assert_eq!(ours["compute_dtype"], "float32");
    assert!(ours["dtype_reason"].as_str().unwrap().contains("CPU"), "{}", ours["dtype_reason"]);
    assert_eq!(ids(&ours["tokens"]).len(), 4);
}

/// mlx_lm.convert (recent transformers) writes the chat template to
/// `chat_template.jinja` instead of tokenizer_config.json: the same chat
/// must tokenize identically from either place.
#[test]
fn a_chat_template_in_chat_template_jinja_is_used() {
    let src = model("smollm2-135m-instruct");
    let s = Scratch::new("jinja");
    for f in ["config.json", "model.safetensors", "tokenizer.json", "generation_config.json", "special_tokens_map.json"]
    {
        if src.join(f).exists() {
            std::os::unix::fs::symlink(src.join(f), s.0.join(f)).unwrap();
        }
    }
    let mut tc: Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("tokenizer_config.json")).unwrap()).unwrap();
    let template = tc.as_object_mut().unwrap().remove("chat_template").expect("the default model has a template");
    std::fs::write(s.0.join("tokenizer_config.json"), tc.to_string()).unwrap();
    std::fs::write(s.0.join("chat_template.jinja"), template.as_str().unwrap()).unwrap();
    let ids = |d: &std::path::Path| {
        ids(&host_json(&[
            "generate",
            "--model",
            d.to_str().unwrap(),
            "--chat",
            "What is 2+2?",
            "--max-tokens",
            "1",
            "--json",
        ])["prompt_tokens"])
    };
    assert_eq!(ids(&s.0), ids(&src));
}

/// `--gpu-attention` picks the multi-token attention kernels on a GPU
/// (`mlx`: MLX's sdpa, bit-identical to mlx-lm there; measured by hand on the
/// H200, docs/benchmarks.md). On the CPU both modes run the same kernels, so
/// here: `mlx` is accepted by generate and by serve's config file and
/// changes nothing, and any other value is refused with the choices.
#[test]
fn gpu_attention_is_a_checked_choice() {
    let d = model("tiny/tiny-llama-f32");
    let d = d.to_str().unwrap();
    let base = ["generate", "--model", d, "--prompt-ids", PROMPT, "--max-tokens", "8", "--ignore-eos", "--json"];
    let plain = host_json(&base);
    let mlx = host_json(&[&base[..], &["--gpu-attention", "mlx"]].concat());
    assert_eq!(ids(&plain["tokens"]), ids(&mlx["tokens"]));
    let bad = Command::new(host_bin())
        .current_dir(it::repo_root())
        .args(base)
        .args(["--gpu-attention", "exact"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success() && err.contains("fast or mlx"), "{err}");
    let s = Scratch::new("gpuattn");
    let cfg = s.0.join("serve.toml");
    std::fs::write(&cfg, format!("model = {d:?}\ngpu_attention = \"sometimes\"\n")).unwrap();
    let bad =
        Command::new(host_bin()).current_dir(it::repo_root()).args(["serve", "--config"]).arg(&cfg).output().unwrap();
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success() && err.contains("fast or mlx"), "{err}");
}

/// Raw text tokenized as mlx_lm.stream_generate does (the tokenizer's
/// special tokens, BOS unless the text starts with it), including text that
/// spells a special token and non-ASCII text, then the same greedy tokens.
#[test]
fn raw_text_prompts_tokenize_and_continue_like_mlx_lm() {
    let dir = model("smollm2-135m-instruct");
    let d = dir.to_str().unwrap();
    for text in [
        "Once upon a time, in a land far away,",
        "<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n",
        "Ünïcödé — 日本語のテキスト and emoji 🦀: ",
        "def fib(n):\n    if n < 2:\n        return n\n   ",
    ] {
        let r = oracle(&dir, &["--prompt", text, "--max-tokens", "12"]);
        let ours = host_json(&[
            "generate",
            "--model",
            d,
            "--prompt",
            text,
            "--max-tokens",
            "12",
            "--ignore-eos",
            "--dtype",
            "native",
            "--json",
        ]);
        assert_eq!(ids(&ours["prompt_tokens"]), ids(&r["prompt_ids"]), "{text:?}: tokenization differs from mlx-lm");
        assert_eq!(ids(&ours["tokens"]), ids(&r["tokens"]), "{text:?}: greedy continuation differs from mlx-lm");
    }
}

/// A prompt longer than one prefill chunk (2048 tokens): prefilled in two
/// chunks as mlx-lm's generate_step does, then the same greedy tokens and
/// per-step log-probabilities.
#[test]
fn prompts_longer_than_a_prefill_chunk_match_mlx_lm() {
    let prompt: Vec<String> = (0..2300u64).map(|i| ((i * 7919 + 13) % 49000 + 10).to_string()).collect();
    check_prompt("tiny-llama-f32", &prompt.join(","));
    check_prompt("tiny-qwen3-bf16", &prompt.join(","));
}
