//! Compiled functions of different plugins share libmlx's one compile cache
//! without sharing entries. Every family plugin carries its own copy of
//! model-kit, whose fused SwiGLU, GeGLU and softcap are compiled on first use
//! (`model_kit::compiled`). With ids from a per-copy counter (as mlx-rs's
//! `compile` numbers them) the first compiled function of two plugins would
//! get the same key, and the second plugin would run the first one's traced
//! graph. Here several families run interleaved in one process, and each
//! must decode exactly as it does alone in a fresh `host` process.

use host_engine::{Engine, Flow, GenerateRequest, SamplingParams};
use std::process::Command;

const PROMPT: [u32; 5] = [1, 2, 3, 4, 5];
const TOKENS: usize = 24;

fn request() -> GenerateRequest {
    GenerateRequest {
        prompt: PROMPT.to_vec(),
        max_tokens: TOKENS,
        params: SamplingParams::default(),
        stop_on_eos: false,
        logprobs: None,
        constraint: None,
    }
}

/// Greedy tokens of `folder` decoded alone, in a process of its own.
fn alone(folder: &str) -> Vec<u32> {
    let ids = PROMPT.map(|t| t.to_string()).join(",");
    let dir = it::model(folder);
    let out = it::run_ok(Command::new(it::host_bin()).current_dir(it::repo_root()).args([
        "generate",
        "--model",
        dir.to_str().unwrap(),
        "--prompt-ids",
        &ids,
        "--max-tokens",
        &TOKENS.to_string(),
        "--ignore-eos",
        "--dtype",
        "native",
        "--json",
    ]));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v["tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect()
}

#[test]
fn families_compiling_in_one_process_each_run_their_own_fused_graphs() {
    // Each of these families' first compiled function takes two rank-3
    // float32 inputs: the case a shared key would confuse.
    let folders = ["tiny/tiny-llama-f32", "tiny/tiny-gemma3-f32", "tiny/tiny-qwen3_moe-f32", "tiny/tiny-gemma4-f32"];
    let want: Vec<Vec<u32>> = folders.iter().map(|f| alone(f)).collect();
    let _mlx = it::mlx_exclusive();
    let engines: Vec<Engine> = folders.iter().map(|f| it::engine(f, Default::default())).collect();
    // Twice round, so later plugins compile after earlier ones have traced.
    for _ in 0..2 {
        for (i, e) in engines.iter().enumerate() {
            let got = it::run_serial(e, &request(), |_| Flow::Continue).tokens;
            assert_eq!(got, want[i], "{} decodes differently next to other plugins", folders[i]);
        }
    }
}
