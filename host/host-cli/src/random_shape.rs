//! `host bench --model shape:<name>`: a model folder of a real
//! architecture's shape with random weights, for benchmarks on machines
//! without a model hub (as tests/bench/make_shape.py makes with mlx-lm's
//! classes). Qwen3 shapes in the Hugging Face layout the llama-lineage
//! family loads, bf16, the vocabulary cut to 49152 (the SmolLM2
//! tokenizer's); made once under the system's temporary folder.

use anyhow::{bail, Context, Result};
use mlx_rs::{random, Array, Dtype};
use serde_json::json;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// One named shape.
struct Shape {
    name: &'static str,
    hidden: i32,
    layers: usize,
    inter: i32,
    heads: i32,
    kv: i32,
    hd: i32,
    tied: bool,
}

const fn shape(name: &'static str, hidden: i32, layers: usize, inter: i32, heads: i32, kv: i32, tied: bool) -> Shape {
    Shape { name, hidden, layers, inter, heads, kv, hd: if hidden < 1024 { 64 } else { 128 }, tied }
}

const SHAPES: &[Shape] = &[
    shape("qwen3-tiny", 256, 4, 768, 4, 2, true),
    shape("qwen3-0.6b", 1024, 28, 3072, 16, 8, true),
    // Qwen3-8B: an untied head.
    shape("qwen3-8b", 4096, 36, 12288, 32, 8, false),
];
const VOCAB: i32 = 49152;

/// The folder `model` names: itself, or for `shape:<name>` the random
/// folder of that shape (made on first use).
pub fn resolve(model: &Path) -> Result<PathBuf> {
    let Some(name) = model.to_str().and_then(|m| m.strip_prefix("shape:")) else { return Ok(model.to_path_buf()) };
    let Some(&Shape { hidden, layers, inter, heads, kv, hd, tied, .. }) = SHAPES.iter().find(|s| s.name == name) else {
        let known: Vec<&str> = SHAPES.iter().map(|s| s.name).collect();
        bail!("unknown shape `{name}` (known: {})", known.join(", "));
    };
    let dir = std::env::temp_dir().join("mlx-engine-shapes").join(name);
    if dir.join("config.json").exists() {
        return Ok(dir);
    }
    let tmp = dir.with_extension("partial");
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let config = json!({
        "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "vocab_size": VOCAB,
        "hidden_size": hidden, "num_hidden_layers": layers, "intermediate_size": inter,
        "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": hd,
        "rms_norm_eps": 1e-6, "rope_theta": 1_000_000.0, "max_position_embeddings": 40960,
        "tie_word_embeddings": tied, "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2,
    });
    std::fs::write(tmp.join("config.json"), serde_json::to_string_pretty(&config)?)?;
    eprintln!("making random weights of shape {name} in {}", dir.display());
    // One file per layer keeps each write small (the folder loads every
    // *.safetensors in it).
    let mut key = random::key(0)?;
    let mut normal = |shape: &[i32]| -> Result<Array> {
        let (k, sub) = random::split(&key, 2)?;
        key = k;
        Ok(random::normal::<f32>(shape, None, 0.02, &sub)?.as_dtype(Dtype::Bfloat16)?)
    };
    let ones = |n: i32| -> Result<Array> { Ok(Array::ones::<f32>(&[n])?.as_dtype(Dtype::Bfloat16)?) };
    let mut top = HashMap::new();
    top.insert("model.embed_tokens.weight".to_owned(), normal(&[VOCAB, hidden])?);
    top.insert("model.norm.weight".to_owned(), ones(hidden)?);
    if !tied {
        top.insert("lm_head.weight".to_owned(), normal(&[VOCAB, hidden])?);
    }
    save(&tmp.join("model-top.safetensors"), top)?;
    for i in 0..layers {
        let p = format!("model.layers.{i}");
        let mut t = HashMap::new();
        for (name, shape) in [
            ("self_attn.q_proj", [heads * hd, hidden]),
            ("self_attn.k_proj", [kv * hd, hidden]),
            ("self_attn.v_proj", [kv * hd, hidden]),
            ("self_attn.o_proj", [hidden, heads * hd]),
            ("mlp.gate_proj", [inter, hidden]),
            ("mlp.up_proj", [inter, hidden]),
            ("mlp.down_proj", [hidden, inter]),
        ] {
            t.insert(format!("{p}.{name}.weight"), normal(&shape)?);
        }
        t.insert(format!("{p}.self_attn.q_norm.weight"), ones(hd)?);
        t.insert(format!("{p}.self_attn.k_norm.weight"), ones(hd)?);
        t.insert(format!("{p}.input_layernorm.weight"), ones(hidden)?);
        t.insert(format!("{p}.post_attention_layernorm.weight"), ones(hidden)?);
        save(&tmp.join(format!("model-layer-{i:03}.safetensors")), t)?;
    }
    std::fs::rename(&tmp, &dir).with_context(|| format!("moving {} into place", tmp.display()))?;
    Ok(dir)
}

fn save(path: &Path, tensors: HashMap<String, Array>) -> Result<()> {
    Array::save_safetensors(tensors, None, path).with_context(|| format!("writing {}", path.display()))
}
