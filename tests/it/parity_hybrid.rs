//! Parity of the Qwen3.5 hybrid (model-qwen3-5 over state-recurrent for its
//! gated DeltaNet layers and kv-plain for its attention layers) with mlx-lm.
//! The tiny models have 4 layers, DeltaNet at 0 and 2, attention at 1 and 3;
//! the MoE variant routes every MLP to 2 of 8 experts plus a shared expert.
//!
//! bf16 MoE: MLX's CPU `gather_mm` is float32-only, so mlx-lm cannot run
//! that folder natively here; it is compared in float32 instead (as the
//! dense bf16 folder also is, which covers the cast at load).

use crate::parity::{check, check_prompt};
use it::{host_bin, model, python, run_ok, Scratch, Server};
use serde_json::{json, Value};

#[test]
fn qwen3_5_f32() {
    check("tiny-qwen3_5-f32");
}

#[test]
fn qwen3_5_bf16() {
    check("tiny-qwen3_5-bf16");
}

#[test]
fn qwen3_5_q4() {
    check("tiny-qwen3_5-q4");
}

#[test]
fn qwen3_5_moe_f32() {
    check("tiny-qwen3_5_moe-f32");
}

#[test]
fn qwen3_5_moe_q4() {
    check("tiny-qwen3_5_moe-q4");
}

fn long_prompt() -> String {
    (0..40u64).map(|i| ((i * 7919) % 49000 + 10).to_string()).collect::<Vec<_>>().join(",")
}

/// 40 prompt ids: the prefill runs the recurrence over 39 steps in one
/// forward (and the logits forward over 40), so the state carries a long
/// chain of updates before the first decode step; the MoE folders route 78
/// (token, expert) pairs, past mlx-lm's sorted-gather threshold of 64.
#[test]
fn qwen3_5_long_prompt() {
    for name in
        ["tiny-qwen3_5-f32", "tiny-qwen3_5-bf16", "tiny-qwen3_5-q4", "tiny-qwen3_5_moe-f32", "tiny-qwen3_5_moe-q4"]
    {
        check_prompt(name, &long_prompt());
    }
}

/// 64 greedy tokens from mlx-lm's own load of `dir` (every parameter cast
/// to float32 when `f32`) and from ours (`--dtype float32` or native).
fn both_engines(dir: &std::path::Path, prompt: &str, f32: bool) -> (Value, Value) {
    let script = "import sys, json, mlx.core as mx\n\
        from mlx_lm.utils import load\nfrom mlx_lm.generate import generate_step\n\
        m, _ = load(sys.argv[1])\nif sys.argv[3] == 'f32': m.set_dtype(mx.float32)\n\
        ids = mx.array([int(t) for t in sys.argv[2].split(',')])\n\
        print(json.dumps([t for t, _ in generate_step(ids, m, max_tokens=64)]))";
    let dtype = if f32 { "float32" } else { "native" };
    let want: Value = serde_json::from_str(
        run_ok(python().args(["-c", script]).arg(dir).arg(prompt).arg(if f32 { "f32" } else { "native" })).trim(),
    )
    .unwrap();
    let mut cmd = std::process::Command::new(host_bin());
    cmd.current_dir(it::repo_root()).args(["generate", "--model"]).arg(dir);
    cmd.args(["--prompt-ids", prompt, "--max-tokens", "64", "--ignore-eos", "--dtype", dtype, "--json"]);
    let got: Value = serde_json::from_str(&run_ok(&mut cmd)).unwrap();
    (got["tokens"].clone(), want)
}

/// The bf16 folders computed in float32 (`--dtype float32`) against mlx-lm
/// with every parameter cast to float32.
#[test]
fn qwen3_5_bf16_folders_in_float32_match_mlx_lm() {
    for name in ["tiny-qwen3_5-bf16", "tiny-qwen3_5_moe-bf16"] {
        let dir = model(&format!("tiny/{name}"));
        for prompt in ["1,2,3,4,5".to_owned(), long_prompt()] {
            let (got, want) = both_engines(&dir, &prompt, true);
            assert_eq!(got, want, "{name}, prompt {prompt}");
        }
    }
}

/// A Hugging Face checkpoint as published (the multimodal layout): config
/// under `text_config`, tensors under `model.language_model.*` and
/// `lm_head`, conv weights `[C, 1, K]`, norm weights stored minus one, the
/// experts fused (`experts.gate_up_proj`, `experts.down_proj`), plus vision
/// and multi-token-prediction tensors to skip. mlx-lm's sanitize undoes all
/// of it at load, and so does ours.
#[test]
fn qwen3_5_loads_unsanitized_hugging_face_checkpoints() {
    let script = "import sys, json, shutil, mlx.core as mx\n\
        src, dst = sys.argv[1], sys.argv[2]\n\
        norms = ('.input_layernorm.weight', '.post_attention_layernorm.weight', 'model.norm.weight', '.q_norm.weight', '.k_norm.weight')\n\
        out = {}\n\
        for k, v in mx.load(src + '/model.safetensors').items():\n\
        \x20   if 'conv1d.weight' in k: v = v.moveaxis(1, 2)\n\
        \x20   if k.endswith(norms): v = v - 1.0\n\
        \x20   out[k.replace('language_model.model.', 'model.language_model.').replace('language_model.lm_head', 'lm_head')] = v\n\
        for k in [k for k in out if k.endswith('.switch_mlp.gate_proj.weight')]:\n\
        \x20   p = k[:-len('.switch_mlp.gate_proj.weight')]\n\
        \x20   gate, up = out.pop(k), out.pop(p + '.switch_mlp.up_proj.weight')\n\
        \x20   out[p + '.experts.gate_up_proj'] = mx.concatenate([gate, up], axis=1)\n\
        \x20   out[p + '.experts.down_proj'] = out.pop(p + '.switch_mlp.down_proj.weight')\n\
        out['model.visual.patch_embed.proj.weight'] = mx.zeros((8, 3)); out['mtp.fc.weight'] = mx.zeros((8, 8))\n\
        mx.save_safetensors(dst + '/model.safetensors', out)\n\
        cfg = json.load(open(src + '/config.json'))\n\
        json.dump({'model_type': cfg['model_type'], 'architectures': cfg['architectures'], 'text_config': cfg, 'vision_config': {}}, open(dst + '/config.json', 'w'))\n\
        [shutil.copy(src + '/' + f, dst) for f in ('tokenizer.json', 'tokenizer_config.json')]";
    for name in ["tiny-qwen3_5-f32", "tiny-qwen3_5_moe-f32"] {
        let dst = Scratch::new("qwen3_5-hf");
        run_ok(python().args(["-c", script]).arg(model(&format!("tiny/{name}"))).arg(&dst.0));
        let (got, want) = both_engines(&dst.0, "1,2,3,4,5", false);
        assert_eq!(got, want, "{name} in the Hugging Face layout");
    }
}

/// Continuous batching: rows prefilled on their own caches and merged into
/// the batch (recurrent states concatenated along the batch axis, K/V
/// left-padded) decode exactly as each request alone.
#[test]
fn qwen3_5_batched_rows_match_serial() {
    crate::batching::staggered_batch_equals_serial("tiny/tiny-qwen3_5-f32");
    crate::batching::staggered_batch_equals_serial("tiny/tiny-qwen3_5_moe-f32");
}

fn generate(prompt: &str, extra: &[&str]) -> Value {
    let mut cmd = std::process::Command::new(host_bin());
    cmd.current_dir(it::repo_root()).args(["generate", "--model"]).arg(model("tiny/tiny-qwen3_5-f32"));
    cmd.args(["--prompt-ids", prompt, "--max-tokens", "40", "--ignore-eos", "--dtype", "native", "--json"]).args(extra);
    serde_json::from_str(&run_ok(&mut cmd)).unwrap()
}

/// The family's own `delta` model option (the DeltaNet route on a GPU;
/// the CPU runs the ops route either way): `delta=ops` opens and decodes
/// as the default does, and a value the family does not know stops the
/// start with one line naming it.
#[test]
fn qwen3_5_delta_option() {
    let prompt = "1,2,3,4,5,6,7,8";
    assert_eq!(generate(prompt, &["--model-option", "delta=ops"])["tokens"], generate(prompt, &[])["tokens"]);
    let out = std::process::Command::new(host_bin())
        .current_dir(it::repo_root())
        .args(["generate", "--model"])
        .arg(model("tiny/tiny-qwen3_5-f32"))
        .args(["--prompt-ids", prompt, "--max-tokens", "4", "--model-option", "delta=fast"])
        .output()
        .expect("spawn");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a bad delta value was accepted");
    assert!(err.contains("`delta=fast`") && err.contains("delta=kernel or delta=ops"), "{err}");
}

/// Speculation over a recurrent layout: after a rejected draft the layout
/// keeps the state after the pending token, picked from the verify's
/// position states (no replay), or with `--model-option rollback=replay`
/// restores the round's start for the host to replay the kept tokens
/// (`caps::SPEC_REPLAY`, the path of graphs without position states).
/// Greedy output must equal the plain run either way. (The random model
/// never repeats itself, so every n-gram draft is rejected here; rows
/// keeping several tokens are covered by the batched test below and by
/// state-recurrent's unit tests.)
#[test]
fn qwen3_5_speculation_is_lossless() {
    let prompt = "1,2,3,4,5,6,7,1,2,3,4,5,6,7,1,2,3";
    let plain = generate(prompt, &[]);
    for (option, replayed) in [(None, false), (Some("rollback=replay"), true)] {
        // --speculate-always: every draft is rejected here, and the cost
        // rule would end the rounds (and the rollbacks) after four.
        let mut args = vec!["--draft-kind", "ngram", "--speculate-always"];
        args.extend(option.iter().flat_map(|o| ["--model-option", o]));
        let spec = generate(prompt, &args);
        let sp = &spec["speculation"];
        assert!(sp["drafted"].as_u64().unwrap() > sp["accepted"].as_u64().unwrap(), "{option:?}: {sp}");
        assert_eq!(sp["replays"].as_u64().unwrap() > 0, replayed, "{option:?}: {sp}");
        assert_eq!(spec["tokens"], plain["tokens"], "{option:?}: speculation changed the greedy output: {sp}");
    }
}

/// A prompt that shares only part of a cached entry: a recurrent state
/// cannot be trimmed to the shared prefix, so that entry is unusable, and
/// the answer must be what a cold server gives.
#[test]
fn qwen3_5_a_partial_prefix_hit_does_not_change_the_output() {
    let m = model("tiny/tiny-qwen3_5-f32");
    let a: Vec<u32> = (1..=20).collect();
    let b: Vec<u32> = (1..=10).chain([99, 98, 97, 96, 95]).collect();
    let ask = |s: &Server, p: &[u32]| -> (Value, u64) {
        let r = s.post("/v1/completions", &json!({ "prompt": p, "max_tokens": 16, "temperature": 0 })).json();
        (r["choices"][0]["text"].clone(), r["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap())
    };
    let cold = Server::start(&m, &["--prompt-cache", "0", "--batch", "1"]);
    let (want, _) = ask(&cold, &b);
    let warm = Server::start(&m, &["--prompt-cache", "0.5", "--batch", "1"]);
    ask(&warm, &a);
    let (got, cached) = ask(&warm, &b);
    assert_eq!(cached, 0, "a recurrent state was trimmed to a partial prefix");
    assert_eq!(got, want);
    // The entry is there and serves what it can: `a` continued reuses it.
    let longer: Vec<u32> = a.iter().copied().chain([50, 51]).collect();
    let (_, cached) = ask(&warm, &longer);
    assert!(cached >= a.len() as u64 - 1, "the cached entry of `a` was not reused ({cached} tokens)");
}

/// `prompts` sent as a burst (queued while the engine is held) to a `--batch 8` server
/// form a cohort (one left-padded prefill, `cohort_prefills` in /stats), and
/// each greedy answer equals the same prompt's answer on a serial server.
fn burst_prefills_as_a_cohort_and_matches_serial(name: &str, prompts: &[Vec<u32>]) {
    let m = model(name);
    let body = |p: &Vec<u32>| json!({ "prompt": p, "max_tokens": 20, "temperature": 0 });
    let text = |r: Value| r["choices"][0]["text"].as_str().unwrap().to_owned();
    let want: Vec<String> = {
        let s = Server::start(&m, &["--batch", "1"]);
        prompts.iter().map(|p| text(s.post("/v1/completions", &body(p)).json())).collect()
    };
    let s = Server::start(&m, &["--batch", "8", "--debug-endpoints"]);
    let bodies: Vec<Value> = prompts.iter().map(body).collect();
    let got: Vec<String> = s.post_burst("/v1/completions", &bodies).into_iter().map(text).collect();
    let st = s.stats();
    assert!(
        st["cohort_prefills"].as_u64().unwrap() >= 1 && st["cohort_rows"].as_u64().unwrap() >= 2,
        "the burst never prefilled as a cohort: {st}"
    );
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "{name}: request {i} differs between its cohort prefill and its serial run");
    }
}

/// Cohort prefill over recurrent state: state-recurrent starts the rows
/// left-padded (`begin_padded`) and masks the padding (`[B, L]`, mlx-lm's
/// `make_mask`), the DeltaNet layers zero padded conv inputs and keep the
/// state on padded steps, kv-plain hides the padding from attention (the
/// MoE folder also routes the padded tokens). Heads of 6..11 tokens pad
/// within one chunk.
#[test]
fn qwen3_5_burst_prefills_as_one_padded_cohort_and_matches_serial() {
    let prompts: Vec<Vec<u32>> = (0..6u32).map(|i| (0..7 + i).map(|k| 10 + 37 * i + 3 * k).collect()).collect();
    burst_prefills_as_a_cohort_and_matches_serial("tiny/tiny-qwen3_5-f32", &prompts);
    burst_prefills_as_a_cohort_and_matches_serial("tiny/tiny-qwen3_5_moe-f32", &prompts);
}

/// Heads of 370..740 tokens: a cohort chunk is 2048 / 6 = 341 columns, so
/// the shortest rows are all padding in the first chunk and still partly
/// padding in the second (the layout tracks each row's remaining padding).
#[test]
fn qwen3_5_cohort_padding_spans_prefill_chunks() {
    let prompts: Vec<Vec<u32>> =
        (0..6u32).map(|i| (0..371 + 74 * i).map(|k| 10 + (37 * i + 3 * k) % 40000).collect()).collect();
    burst_prefills_as_a_cohort_and_matches_serial("tiny/tiny-qwen3_5-f32", &prompts);
}

/// Batched speculation over recurrent state. The cycle folder
/// (models/scripts/make_cycle.py) mostly repeats 1000..1006 and leaves the
/// cycle where its layers, recurrent state included, tip the argmax; each
/// prompt seeds prompt lookup with a different wrong turn, so rows accept
/// runs of different lengths in the same step. A rollback keeps each row's
/// count from the verify's position states; with `--model-option
/// rollback=replay` it restores every row's state and ONE padded forward
/// replays each row's kept tokens. Greedy text and logprobs must equal the
/// plain serial server's either way, and only the second may replay.
#[test]
fn qwen3_5_batched_speculation_keeps_each_rows_count() {
    let dir = Scratch::new("qwen3_5-cycle");
    run_ok(
        python()
            .arg(it::repo_root().join("models/scripts/make_cycle.py"))
            .arg(model("tiny/tiny-qwen3_5-f32"))
            .arg(&dir.0),
    );
    let prompts: Vec<Vec<u32>> = vec![
        vec![1000, 1001, 1002, 1003, 5, 6, 7, 1000, 1001, 1002],
        vec![1004, 1005, 1006, 1000, 1001, 1002, 1003, 1004],
        vec![1001, 1002, 9, 1005, 1006, 1000, 1001],
        vec![1003, 1004, 1005, 1006, 1000, 1001, 1002, 1003, 1004, 1005, 1006, 1000, 1001, 1002, 1003],
        vec![1006, 1000, 1001, 40, 41, 42, 1006, 1000],
        vec![1002, 1003],
    ];
    let body = |i: usize| json!({ "prompt": prompts[i], "max_tokens": 24 + 4 * i, "temperature": 0, "logprobs": 1 });
    let want: Vec<Value> = {
        let s = Server::start(&dir.0, &["--batch", "1"]);
        (0..prompts.len()).map(|i| s.post("/v1/completions", &body(i)).json()).collect()
    };
    for option in ["rollback=states", "rollback=replay"] {
        batched_speculation_matches(&dir.0, &prompts, &want, option);
    }
}

fn batched_speculation_matches(dir: &std::path::Path, prompts: &[Vec<u32>], want: &[Value], option: &str) {
    let body = |i: usize| json!({ "prompt": prompts[i], "max_tokens": 24 + 4 * i, "temperature": 0, "logprobs": 1 });
    // --speculate-always: the cost rule depends on timing; the paths asserted below must not.
    let s = Server::start(
        dir,
        &[
            "--batch",
            "8",
            "--draft-kind",
            "ngram",
            "--num-draft-tokens",
            "4",
            "--speculate-always",
            "--debug-endpoints",
            "--model-option",
            option,
        ],
    );
    let got = s.post_joining("/v1/completions", &(0..prompts.len()).map(body).collect::<Vec<_>>(), 3);
    let (mut drafted, mut accepted) = (0, 0);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let (lg, lw) = (&g["choices"][0]["logprobs"], &w["choices"][0]["logprobs"]);
        assert_eq!(
            lg["tokens"], lw["tokens"],
            "{option}: request {i} changed under batched speculation: {}",
            g["usage"]
        );
        for (k, (a, b)) in
            lg["token_logprobs"].as_array().unwrap().iter().zip(lw["token_logprobs"].as_array().unwrap()).enumerate()
        {
            let (a, b) = (a.as_f64().unwrap(), b.as_f64().unwrap());
            // 1e-3: where the distribution is flat (top logprob near -9), the
            // logsumexp over 49152 similar terms moves by up to 4e-4 with the
            // reduction's memory layout (a strided row of the [B, k+1, V]
            // verify logits vs a contiguous one); a wrong state moves
            // logprobs by 0.1 and more (mutation-checked).
            assert!((a - b).abs() < 1e-3, "{option}: request {i} token {k}: logprob {a} batched vs {b} serial");
        }
        let sp = &g["usage"]["speculation"];
        assert!(!sp.is_null(), "request {i} did not speculate: {g}");
        drafted += sp["drafted"].as_u64().unwrap();
        accepted += sp["accepted"].as_u64().unwrap();
    }
    let st = s.stats();
    assert!(st["max_batch_rows"].as_u64().unwrap() >= 2, "speculative rows never shared a step: {st}");
    assert!(
        accepted > 0 && accepted < drafted,
        "drafted {drafted}, accepted {accepted}: need kept and rejected drafts"
    );
    if option == "rollback=replay" {
        assert!(st["spec_replays_padded"].as_u64().unwrap() > 0, "no replay had rows of different counts: {st}");
    } else {
        assert_eq!(st["spec_replays"].as_u64().unwrap(), 0, "a rollback replayed: {st}");
    }
}
