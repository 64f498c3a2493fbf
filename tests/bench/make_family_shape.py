"""Random-weight model folders of each served family at a small but real
shape (hidden 1024), for decode benchmarks on machines without a model hub.
The configs are the tiny parity configs of models/scripts/make_tiny.py with
the sizes scaled up, built with mlx-lm's own classes as there.

Usage: make_family_shape.py --out DIR [--shapes a,b] [--tokenizer-from DIR]
Shapes: qwen3_5-small, qwen3_moe-small, gemma3-small, gemma4-small.
"""
import argparse
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "models" / "scripts"))
import make_tiny  # noqa: E402
from mlx_lm.utils import save_config, save_model  # noqa: E402


def layer_types(n, every):
    return ["full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(n)]


BASE = dict(hidden_size=1024, intermediate_size=3072, num_attention_heads=8, num_key_value_heads=2)
SHAPES = {
    # 12 layers, every 4th full attention; 16 value heads of 128 over 8 key heads.
    "qwen3_5-small": ("qwen3_5", dict(BASE, num_hidden_layers=12, full_attention_interval=4, head_dim=128,
                                      linear_num_key_heads=8, linear_num_value_heads=16,
                                      linear_key_head_dim=128, linear_value_head_dim=128)),
    # 12 layers, all sparse: 4 of 32 experts of width 512.
    "qwen3_moe-small": ("qwen3_moe", dict(BASE, num_hidden_layers=12, head_dim=128, num_experts=32,
                                          num_experts_per_tok=4, moe_intermediate_size=512, mlp_only_layers=[],
                                          max_window_layers=12)),
    # 12 layers, every 6th global, window 512.
    "gemma3-small": ("gemma3", dict(BASE, num_hidden_layers=12, head_dim=128, query_pre_attn_scalar=128,
                                    sliding_window=512, sliding_window_pattern=6, layer_types=layer_types(12, 6))),
    # 12 layers, every 6th global (head dim 256), the last 4 share K/V,
    # per-layer inputs of 128.
    "gemma4-small": ("gemma4", dict(BASE, num_hidden_layers=12, head_dim=128, global_head_dim=256,
                                    sliding_window=512, sliding_window_pattern=6, layer_types=layer_types(12, 6),
                                    num_kv_shared_layers=4, hidden_size_per_layer_input=128)),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--tokenizer-from", type=Path)
    a = ap.parse_args()
    for shape in a.shapes.split(","):
        base, sizes = SHAPES[shape]
        make_tiny.VARIANTS[shape] = {**make_tiny.VARIANTS[base], **sizes}
        model, config = make_tiny.build(shape, "bf16")
        path = a.out / shape
        path.mkdir(parents=True, exist_ok=True)
        save_model(path, model)
        save_config(config, path / "config.json")
        if a.tokenizer_from:
            for f in make_tiny.TOKENIZER_FILES:
                if (a.tokenizer_from / f).exists():
                    shutil.copy(a.tokenizer_from / f, path / f)
        print(f"made {path} {make_tiny.folder_size(path) / 2**20:.0f}MiB", flush=True)


if __name__ == "__main__":
    main()
