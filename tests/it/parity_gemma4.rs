//! Parity of the Gemma 4 family (model-gemma4) with mlx-lm's `gemma4_text`
//! and `gemma4`.
//!
//! `tiny-gemma4-*`: 6 layers S S F S S F over a window of 8, global layers
//! with their own head dim, one KV head with K = V and proportional RoPE,
//! the last two layers sharing the K/V of layers 3 and 2 (4 caches for 6
//! layers), per-layer input embeddings, layer scalars, soft-capped logits.
//! `tiny-gemma4-moe-*`: 3 layers S S F, each with the MoE block (top-2 of 4
//! GeGLU experts) beside its dense MLP; untied.
//!
//! MoE in bf16: MLX's CPU `gather_mm` is float32-only, so mlx-lm cannot run
//! that folder natively here; its weights are compared computed in float32
//! (bf16 activations through router and experts are covered by q4, whose
//! `gather_qmm` runs in bf16).

use crate::parity::{check, check_prompt};
use it::{host_bin, model, python, run_ok, Scratch, Server};
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;

const PROMPT: &str = "1,2,3,4,5";

/// 40 ids, five times the window. With the MoE folders, the prefill's 39
/// tokens route 78 (token, expert) pairs, past mlx-lm's sorting threshold
/// of 64, so the sorted gather path runs too.
fn long_prompt() -> String {
    (0..40u64).map(|i| ((i * 7919) % 49000 + 10).to_string()).collect::<Vec<_>>().join(",")
}

fn host_tokens(dir: &Path, prompt: &str, dtype: &str) -> Vec<u64> {
    let out =
        run_ok(Command::new(host_bin()).current_dir(it::repo_root()).args(["generate", "--model"]).arg(dir).args([
            "--prompt-ids",
            prompt,
            "--max-tokens",
            "64",
            "--ignore-eos",
            "--dtype",
            dtype,
            "--json",
        ]));
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("host printed no JSON ({e}): {out}"));
    v["tokens"].as_array().expect("tokens").iter().map(|t| t.as_u64().unwrap()).collect()
}

/// mlx-lm's greedy 64 tokens for a folder (optionally with every parameter
/// cast to float32 after its own load).
fn mlx_lm_tokens(dir: &Path, prompt: &str, float32: bool) -> Vec<u64> {
    let script = "import sys, json, mlx.core as mx\n\
        from mlx_lm.utils import load\nfrom mlx_lm.generate import generate_step\n\
        m, _ = load(sys.argv[1])\n\
        if sys.argv[3] == '1': m.set_dtype(mx.float32)\n\
        ids = mx.array([int(t) for t in sys.argv[2].split(',')])\n\
        print(json.dumps([t for t, _ in generate_step(ids, m, max_tokens=64)]))";
    let out = run_ok(python().args(["-c", script]).arg(dir).arg(prompt).arg(if float32 { "1" } else { "0" }));
    let want: Vec<u64> = serde_json::from_str(out.trim().lines().last().unwrap_or(""))
        .unwrap_or_else(|e| panic!("mlx-lm printed no token list ({e}): {out}"));
    assert_eq!(want.len(), 64);
    want
}

/// A copy of a tiny folder with its tensors rewritten by `rewrite` (Python
/// over `w`, the name → array dict, writing `out`) and its config changed
/// by `config`.
fn rewritten(src: &Path, tag: &str, rewrite: &str, config: impl FnOnce(Value) -> Value) -> Scratch {
    let dst = Scratch::new(tag);
    let script = format!(
        "import sys, mlx.core as mx\nw = mx.load(sys.argv[1] + '/model.safetensors'); out = {{}}\n{rewrite}\nmx.save_safetensors(sys.argv[2] + '/model.safetensors', out)"
    );
    run_ok(python().args(["-c", &script]).arg(src).arg(&dst.0));
    let cfg: Value = serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    std::fs::write(dst.0.join("config.json"), serde_json::to_string_pretty(&config(cfg)).unwrap()).unwrap();
    for f in ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"] {
        if src.join(f).exists() {
            std::fs::copy(src.join(f), dst.0.join(f)).unwrap();
        }
    }
    dst
}

#[test]
fn gemma4_f32() {
    check("tiny-gemma4-f32");
}

#[test]
fn gemma4_bf16() {
    check("tiny-gemma4-bf16");
}

/// 4-bit, with the per-layer embedding table quantized too (as mlx-lm's
/// convert does: its 192 columns are a multiple of the group size).
#[test]
fn gemma4_q4() {
    check("tiny-gemma4-q4");
}

/// The prefill goes past the window on the sliding layers AND on the
/// shared sliding layer that reuses their keys/values and mask; the full
/// layers attend over all 40.
#[test]
fn gemma4_prompt_longer_than_the_window() {
    let prompt = long_prompt();
    for name in ["tiny-gemma4-f32", "tiny-gemma4-bf16", "tiny-gemma4-q4"] {
        check_prompt(name, &prompt);
    }
}

/// Four caches for six layers: the plan declares none for the KV-shared
/// layers, and the host composes exactly those.
#[test]
fn gemma4_kv_shared_layers_hold_no_cache() {
    let out = run_ok(
        Command::new(host_bin())
            .current_dir(it::repo_root())
            .args(["generate", "--model"])
            .arg(model("tiny/tiny-gemma4-f32"))
            .args(["--prompt-ids", PROMPT, "--max-tokens", "2", "--json"]),
    );
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["family_plugin"], "model-gemma4");
    assert_eq!(v["cache_layouts"], serde_json::json!(["kv-rotating", "kv-rotating", "kv-plain", "kv-rotating"]));
}

/// Three chat turns through the server: with the prefix cache, later turns
/// import the exported states of the 4 cached layers (the shared layers
/// have none) and re-prefill only the new turn, with the same answers as a
/// server without the cache.
#[test]
fn gemma4_prefix_cache_reuse_matches_a_cold_run() {
    let conversation = |s: &Server| -> (Vec<String>, Vec<u64>) {
        let mut msgs = vec![json!({ "role": "user", "content": "Name a fruit." })];
        let (mut answers, mut cached) = (Vec::new(), Vec::new());
        for next in ["And a vegetable?", "And a colour?"] {
            let r = s.post("/v1/chat/completions", &json!({ "messages": msgs, "temperature": 0, "max_tokens": 24 }));
            assert_eq!(r.status, 200, "{}", r.text());
            let r = r.json();
            let a = r["choices"][0]["message"]["content"].as_str().unwrap().to_owned();
            cached.push(r["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap());
            msgs.push(json!({ "role": "assistant", "content": a }));
            msgs.push(json!({ "role": "user", "content": next }));
            answers.push(a);
        }
        (answers, cached)
    };
    let m = model("tiny/tiny-gemma4-f32");
    let (want, _) = conversation(&Server::start(&m, &["--prompt-cache", "0"]));
    let (got, cached) = conversation(&Server::start(&m, &["--prompt-cache", "0.5"]));
    assert_eq!(got, want, "prefix reuse changed the output");
    assert!(cached[0] == 0 && cached[1] > 0, "the second turn should reuse the first: {cached:?}");
}

/// The multimodal `gemma4` wrapper: config.json with a `text_config`, the
/// text model's tensors under `language_model.model.` (as mlx-lm saves it)
/// or `model.language_model.` beside a vision tower (as Hugging Face does).
/// mlx-lm and we load both and agree token for token.
#[test]
fn gemma4_multimodal_wrapper_config_and_tensor_names() {
    let src = model("tiny/tiny-gemma4-f32");
    let wrap = |text: Value| {
        let mut text = text;
        let vocab = text["vocab_size"].clone();
        let dtype = text["torch_dtype"].clone();
        text.as_object_mut().unwrap().remove("vocab_size");
        serde_json::json!({
            "model_type": "gemma4",
            "architectures": ["Gemma4ForConditionalGeneration"],
            "vocab_size": vocab,
            "torch_dtype": dtype,
            "text_config": text,
        })
    };
    let layouts = [
        ("gemma4-mm-mlx", "for k, v in w.items(): out['language_model.' + k] = v"),
        ("gemma4-mm-hf", "for k, v in w.items(): out['model.language_model.' + k.removeprefix('model.')] = v\nout['model.vision_tower.patch.weight'] = mx.zeros((2, 2))"),
    ];
    let want = host_tokens(&src, PROMPT, "native");
    for (tag, rewrite) in layouts {
        let dir = rewritten(&src, tag, rewrite, wrap);
        assert_eq!(mlx_lm_tokens(&dir.0, PROMPT, false), want, "{tag}: mlx-lm reads the wrapper differently");
        assert_eq!(host_tokens(&dir.0, PROMPT, "native"), want, "{tag}");
    }
}

#[test]
fn gemma4_moe_f32() {
    check("tiny-gemma4-moe-f32");
}

/// The router's projection is 8-bit (mlx-lm's quant_predicate) inside a
/// 4-bit checkpoint; the experts run through `gather_qmm`.
#[test]
fn gemma4_moe_q4() {
    check("tiny-gemma4-moe-q4");
}

#[test]
fn gemma4_moe_long_prompt_takes_the_sorted_expert_path() {
    let prompt = long_prompt();
    check_prompt("tiny-gemma4-moe-f32", &prompt);
    check_prompt("tiny-gemma4-moe-q4", &prompt);
}

#[test]
fn gemma4_moe_bf16_weights_in_float32_match_mlx_lm() {
    let dir = model("tiny/tiny-gemma4-moe-bf16");
    for prompt in [PROMPT.to_owned(), long_prompt()] {
        assert_eq!(host_tokens(&dir, &prompt, "float32"), mlx_lm_tokens(&dir, &prompt, true), "prompt {prompt}");
    }
}

/// Hugging Face checkpoints fuse gate and up as `experts.gate_up_proj`
/// `[E, 2I, H]` and name the down projection `experts.down_proj`; mlx-lm's
/// sanitize splits them, and so does our load.
#[test]
fn gemma4_moe_loads_fused_hugging_face_experts() {
    let src = model("tiny/tiny-gemma4-moe-f32");
    let rewrite = "import re\n\
        for k, v in w.items():\n\
        \x20   m = re.fullmatch(r'(.*\\.experts)\\.switch_glu\\.(\\w+)_proj\\.weight', k)\n\
        \x20   if not m: out[k] = v\n\
        \x20   elif m[2] == 'down': out[m[1] + '.down_proj'] = v\n\
        \x20   elif m[2] == 'gate': out[m[1] + '.gate_up_proj'] = mx.concatenate([v, w[m[1] + '.switch_glu.up_proj.weight']], axis=-2)\n\
        assert any(k.endswith('.experts.gate_up_proj') for k in out)";
    let dir = rewritten(&src, "gemma4-moe-hf", rewrite, |c| c);
    let want = host_tokens(&src, PROMPT, "native");
    assert_eq!(mlx_lm_tokens(&dir.0, PROMPT, false), want, "mlx-lm reads the fused layout differently");
    assert_eq!(host_tokens(&dir.0, PROMPT, "native"), want);
}

#[test]
fn gemma4_moe_is_refused_without_its_sizes() {
    let src = model("tiny/tiny-gemma4-moe-f32");
    let dir = rewritten(&src, "gemma4-moe-bad", "out.update(w)", |mut c| {
        c.as_object_mut().unwrap().remove("top_k_experts");
        c
    });
    let out = Command::new(host_bin())
        .current_dir(it::repo_root())
        .args(["generate", "--model"])
        .arg(&dir.0)
        .args(["--prompt-ids", PROMPT, "--max-tokens", "2"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("top_k_experts"), "{err}");
}
