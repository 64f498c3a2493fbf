//! Parity of `model-qwen3-moe` (model-kit's `moe` layers) with mlx-lm's
//! `qwen3_moe.py` / `switch_layers.py`: greedy tokens identical and
//! last-prompt logits within tolerance (`parity::check`), on the tiny
//! folders (3 layers: experts on 0 and 2, dense on 1; 8 experts, top 2).
//!
//! bf16: MLX's CPU `gather_mm` is float32-only, so mlx-lm itself cannot run
//! the bf16 folder natively on this backend; we check that ours fails the
//! same way, and that both agree token for token once the bf16 weights are
//! computed in float32 (and the q4 weights dequantized to float32). bf16 activations through the router and the mixing
//! are covered by q4 (`gather_qmm` runs in bf16 on the CPU).

use crate::parity::{check, check_prompt};
use it::{host_bin, model, python, run_ok, Scratch};
use serde_json::Value;
use std::process::Command;

const PROMPT: &str = "1,2,3,4,5";

/// 40 ids: the prefill's 39 tokens route 78 (token, expert) pairs and the
/// logits forward 80, past mlx-lm's threshold of 64 (`indices.size >= 64`),
/// so the pairs are sorted by expert and gathered with `sorted_indices`.
fn long_prompt() -> String {
    (0..40u64).map(|i| ((i * 7919) % 49000 + 10).to_string()).collect::<Vec<_>>().join(",")
}

fn host_tokens(dir: &std::path::Path, prompt: &str, dtype: &str) -> Vec<u64> {
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

#[test]
fn qwen3_moe_f32() {
    check("tiny-qwen3_moe-f32");
}

#[test]
fn qwen3_moe_q4() {
    check("tiny-qwen3_moe-q4");
}

#[test]
fn qwen3_moe_long_prompt_takes_the_sorted_expert_path() {
    let prompt = long_prompt();
    check_prompt("tiny-qwen3_moe-f32", &prompt);
    check_prompt("tiny-qwen3_moe-q4", &prompt);
}

#[test]
fn qwen3_moe_bf16_native_fails_as_mlx_lm_does_on_the_cpu() {
    let dir = model("tiny/tiny-qwen3_moe-bf16");
    let out = Command::new(host_bin())
        .current_dir(it::repo_root())
        .args(["generate", "--model"])
        .arg(&dir)
        .args(["--prompt-ids", PROMPT, "--max-tokens", "4", "--dtype", "native", "--json"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "expected a clean failure, got {:?}: {err}", out.status);
    assert!(err.contains("GatherMM") && err.contains("float32"), "not MLX's gather_mm refusal: {err}");
}

/// mlx-lm's own load, quantized layers dequantized and every parameter cast
/// to float32: what `--dtype float32` does to the weights at load.
fn mlx_lm_float32_tokens(dir: &std::path::Path, prompt: &str) -> Vec<u64> {
    let script = "import sys, json, mlx.core as mx\n\
        from mlx_lm.utils import load, dequantize_model\nfrom mlx_lm.generate import generate_step\n\
        m, _ = load(sys.argv[1]); m = dequantize_model(m); m.set_dtype(mx.float32)\n\
        ids = mx.array([int(t) for t in sys.argv[2].split(',')])\n\
        print(json.dumps([t for t, _ in generate_step(ids, m, max_tokens=64)]))";
    let tokens: Vec<u64> =
        serde_json::from_str(run_ok(python().args(["-c", script]).arg(dir).arg(prompt)).trim()).unwrap();
    assert_eq!(tokens.len(), 64);
    tokens
}

/// The bf16 folder (which mlx-lm cannot run natively here) and the q4 one
/// (3-D expert weights dequantized at load) computed in float32.
#[test]
fn qwen3_moe_bf16_and_q4_in_float32_match_mlx_lm() {
    for name in ["tiny-qwen3_moe-bf16", "tiny-qwen3_moe-q4"] {
        let dir = model(&format!("tiny/{name}"));
        for prompt in [PROMPT.to_owned(), long_prompt()] {
            assert_eq!(
                host_tokens(&dir, &prompt, "float32"),
                mlx_lm_float32_tokens(&dir, &prompt),
                "{name}, prompt {prompt}"
            );
        }
    }
}

/// Hugging Face checkpoints keep one tensor per expert
/// (`mlp.experts.{e}.{gate,up,down}_proj.weight`); mlx-lm's sanitize stacks
/// them, and so does our load: the same folder in that layout generates
/// exactly what the stacked one does.
#[test]
fn qwen3_moe_loads_per_expert_hugging_face_tensors() {
    let src = model("tiny/tiny-qwen3_moe-f32");
    let dst = Scratch::new("moe-hf");
    let script = "import sys, re, mlx.core as mx\n\
        w = mx.load(sys.argv[1] + '/model.safetensors'); out = {}\n\
        for k, v in w.items():\n\
        \x20   m = re.fullmatch(r'(.*\\.mlp)\\.switch_mlp\\.(\\w+)\\.weight', k)\n\
        \x20   if m:\n\
        \x20       out.update({f'{m[1]}.experts.{e}.{m[2]}.weight': v[e] for e in range(v.shape[0])})\n\
        \x20   else:\n\
        \x20       out[k] = v\n\
        assert any('.experts.7.down_proj.' in k for k in out)\n\
        mx.save_safetensors(sys.argv[2] + '/model.safetensors', out)";
    run_ok(python().args(["-c", script]).arg(&src).arg(&dst.0));
    for f in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(src.join(f), dst.0.join(f)).unwrap();
    }
    assert_eq!(host_tokens(&dst.0, PROMPT, "native"), host_tokens(&src, PROMPT, "native"));
}

/// Rows of different requests share decode steps (the experts are picked
/// per token), and each request's greedy text equals its serial run.
#[test]
fn qwen3_moe_staggered_requests_batch_and_match_serial_f32() {
    crate::batching::staggered_batch_equals_serial("tiny/tiny-qwen3_moe-f32");
}
