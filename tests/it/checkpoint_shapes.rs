//! A config.json that lies about the model's geometry is refused at load,
//! naming the tensor that disagrees, its shape and the shape the config
//! implies: every in-tree family checks each tensor a layer takes
//! (model-kit's `shape`). Without the check such a model loaded, and its
//! first request failed inside the cache layout, which got the blame.

use it::Scratch;
use serde_json::{json, Value};

/// A copy of `models/<folder>` (weights and tokenizer linked, not copied)
/// whose config.json has `lie` written over it (into `text_config` when
/// the folder has one).
fn lying_copy(folder: &str, lie: Value) -> Scratch {
    let src = it::model(&format!("tiny/{folder}"));
    let dst = Scratch::new(&format!("lying-{folder}"));
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_owned();
        if name != "config.json" {
            std::os::unix::fs::symlink(&path, dst.0.join(&name)).unwrap();
        }
    }
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    let target = match config.get_mut("text_config") {
        Some(t) if t.is_object() => t,
        _ => &mut config,
    };
    for (k, v) in lie.as_object().unwrap() {
        target[k] = v.clone();
    }
    std::fs::write(dst.0.join("config.json"), serde_json::to_string_pretty(&config).unwrap()).unwrap();
    dst
}

/// The message `Engine::load` fails with, or None when it loads.
fn load_error(dir: &std::path::Path) -> Option<String> {
    let _mlx = it::mlx_exclusive();
    let cfg = host_engine::EngineConfig { dtype: host_engine::DtypeChoice::Native, ..Default::default() };
    host_engine::Engine::load(&it::registry(), dir, cfg).err().map(|e| e.to_string())
}

#[test]
fn a_config_that_lies_about_its_heads_fails_at_load_naming_the_tensor() {
    // (folder, the lie, the tensor named, its shape, the shape the lie implies)
    let cases = [
        (
            "tiny-llama-f32",
            json!({"num_key_value_heads": 1}),
            "model.layers.0.self_attn.k_proj.weight",
            "[32, 64]",
            "[16, 64]",
        ),
        (
            "tiny-llama-q4",
            json!({"num_attention_heads": 2}),
            "model.layers.0.self_attn.q_proj.weight",
            "[64, 64]",
            "[32, 64]",
        ),
        ("tiny-gemma3-f32", json!({"head_dim": 32}), "model.layers.0.self_attn.q_proj.weight", "[64, 64]", "[128, 64]"),
        (
            "tiny-gemma4-f32",
            json!({"num_attention_heads": 8}),
            "layers.0.self_attn.q_proj.weight",
            "[64, 64]",
            "[128, 64]",
        ),
        (
            "tiny-qwen3_5-f32",
            json!({"num_key_value_heads": 1}),
            "layers.1.self_attn.k_proj.weight",
            "[32, 64]",
            "[16, 64]",
        ),
        (
            "tiny-qwen3_moe-f32",
            json!({"head_dim": 8}),
            "model.layers.0.self_attn.q_proj.weight",
            "[64, 64]",
            "[32, 64]",
        ),
    ];
    for (folder, lie, tensor, shape, implied) in cases {
        let dir = lying_copy(folder, lie.clone());
        let e = load_error(&dir.0).unwrap_or_else(|| panic!("{folder} with {lie} loaded"));
        let named = format!("{tensor}` has shape {shape}, config.json implies {implied}");
        assert!(e.contains(&named), "{folder} with {lie}: {e}");
        assert!(!e.contains("cache layout"), "{folder}: {e}");
    }
}

#[test]
fn a_quantized_tensor_is_compared_unpacked_and_an_honest_copy_loads() {
    let dir = lying_copy("tiny-llama-q4", json!({"num_attention_heads": 2}));
    let e = load_error(&dir.0).expect("refused");
    assert!(e.contains("(4-bit quantized, stored as [64, 8])"), "{e}");
    let honest = lying_copy("tiny-llama-q4", json!({}));
    assert_eq!(load_error(&honest.0), None);
}
