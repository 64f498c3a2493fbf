"""A random-weight Gemma 4 target at the 8B scale and an assistant head for
it, to time the `assistant` drafter's rounds (tests/bench/gpu/device_drafters.sh).

    make_assistant_shape.py --out DIR [--tokenizer-from DIR] [--small]

Writes under DIR:
  gemma4-8b/                 a Gemma 4 text model (mlx-lm's classes, bf16):
                             36 layers of width 4096, every 6th full
                             attention (head 256) and the others sliding
                             (head 128, window 1024), 8 K/V heads, GeGLU of
                             12288, tied embeddings;
  gemma4-8b/assistant-rand   a `gemma4_assistant` head for it (width 1024,
                             layers S S S F of 8 query heads, tied LM head,
                             random weights: its drafts are rejected, so a
                             round's cost shows).

`--small` makes both at a small width, to check the script on a CPU.
"""
import argparse
import json
import shutil
import sys
from pathlib import Path

import mlx.core as mx

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "models" / "scripts"))
import make_tiny  # noqa: E402
from mlx_lm.utils import save_config, save_model  # noqa: E402

TARGET = dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
              num_key_value_heads=8, num_global_key_value_heads=8, head_dim=128, global_head_dim=256,
              attention_k_eq_v=False, num_kv_shared_layers=0, hidden_size_per_layer_input=0,
              sliding_window=1024, sliding_window_pattern=6)
HEAD = dict(hidden=1024, inter=4096, heads=8)


def shrink():
    TARGET.update(hidden_size=256, intermediate_size=512, num_hidden_layers=6, num_attention_heads=4,
                  num_key_value_heads=2, num_global_key_value_heads=2, head_dim=64, global_head_dim=128)
    HEAD.update(hidden=128, inter=256, heads=2)


def layer_types(n, every):
    return ["full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(n)]


def copy_tokenizer(src, folder):
    if src:
        for f in make_tiny.TOKENIZER_FILES:
            if (src / f).exists():
                shutil.copy(src / f, folder / f)


def target(out, tok):
    sizes = dict(TARGET, layer_types=layer_types(TARGET["num_hidden_layers"], TARGET["sliding_window_pattern"]))
    make_tiny.VARIANTS["gemma4-8b"] = {**make_tiny.VARIANTS["gemma4"], **sizes}
    model, config = make_tiny.build("gemma4-8b", "bf16")
    out.mkdir(parents=True, exist_ok=True)
    save_model(out, model)
    save_config(config, out / "config.json")
    copy_tokenizer(tok, out)
    return config


def head(out, cfg, tok):
    """The tensors and config of mlx-vlm's `Gemma4AssistantDraftModel`."""
    mx.random.seed(5)
    h, bh, inter, heads = cfg["hidden_size"], HEAD["hidden"], HEAD["inter"], HEAD["heads"]
    kinds = ["sliding_attention"] * 3 + ["full_attention"]
    normal = lambda *shape: (0.02 * mx.random.normal(shape)).astype(mx.bfloat16)  # noqa: E731
    ones = lambda n: mx.ones((n,), dtype=mx.bfloat16)  # noqa: E731
    w = {"model.embed_tokens.weight": normal(cfg["vocab_size"], bh), "model.norm.weight": ones(bh),
         "pre_projection.weight": normal(bh, 2 * h), "post_projection.weight": normal(h, bh)}
    for i, kind in enumerate(kinds):
        hd = cfg["global_head_dim"] if kind == "full_attention" else cfg["head_dim"]
        p = f"model.layers.{i}."
        w.update({p + "self_attn.q_proj.weight": normal(heads * hd, bh), p + "self_attn.q_norm.weight": ones(hd),
                  p + "self_attn.o_proj.weight": normal(bh, heads * hd), p + "mlp.gate_proj.weight": normal(inter, bh),
                  p + "mlp.up_proj.weight": normal(inter, bh), p + "mlp.down_proj.weight": normal(bh, inter),
                  p + "layer_scalar": ones(1)})
        for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                  "post_feedforward_layernorm"):
            w[p + n + ".weight"] = ones(bh)
    text = dict(cfg, hidden_size=bh, intermediate_size=inter, num_hidden_layers=len(kinds), layer_types=kinds,
                num_attention_heads=heads, num_key_value_heads=cfg["num_key_value_heads"])
    config = {"model_type": "gemma4_assistant", "backbone_hidden_size": h, "use_ordered_embeddings": False,
              "num_centroids": 2048, "centroid_intermediate_top_k": 32, "tie_word_embeddings": True,
              "block_size": 4, "text_config": text}
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "model.safetensors"), w)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    copy_tokenizer(tok, out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--tokenizer-from", type=Path)
    ap.add_argument("--small", action="store_true")
    a = ap.parse_args()
    if a.small:
        shrink()
    folder = a.out / "gemma4-8b"
    cfg = target(folder, a.tokenizer_from)
    head(folder / "assistant-rand", cfg, a.tokenizer_from)
    print(f"made {folder} and {folder / 'assistant-rand'}", flush=True)


if __name__ == "__main__":
    main()
