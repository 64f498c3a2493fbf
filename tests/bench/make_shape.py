"""Makes a random-weight model folder of a real architecture's shape with
mlx-lm's own classes (for benchmarks on machines without a model hub).

Usage: make_shape.py --out DIR --preset qwen3-0.6b|qwen3-8b|qwen3-tiny [--dtype bfloat16]
                     [--tokenizer-from DIR]
The vocabulary is 49152 so the SmolLM2 tokenizer files can be copied in
(--tokenizer-from) for chat requests.
"""
import argparse
import json
import shutil
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_map
from mlx_lm.models import qwen3
from mlx_lm.utils import save_config, save_model

PRESETS = {
    # Qwen3-0.6B's shape (vocab reduced to the SmolLM2 tokenizer's).
    "qwen3-0.6b": dict(hidden_size=1024, num_hidden_layers=28, intermediate_size=3072, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128),
    # Qwen3-8B's shape (untied head; vocab reduced likewise): 14.3 GB of
    # bf16 weights with the reduced vocabulary.
    "qwen3-8b": dict(hidden_size=4096, num_hidden_layers=36, intermediate_size=12288, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, tie_word_embeddings=False),
    "qwen3-tiny": dict(hidden_size=256, num_hidden_layers=4, intermediate_size=768, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=64),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--preset", required=True, choices=PRESETS)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--tokenizer-from", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    cfg = dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"], vocab_size=49152, rms_norm_eps=1e-6,
               rope_theta=1000000.0, max_position_embeddings=40960, tie_word_embeddings=True,
               torch_dtype=a.dtype, eos_token_id=2, bos_token_id=1)
    cfg.update(PRESETS[a.preset])
    mx.random.seed(a.seed)
    model = qwen3.Model(qwen3.ModelArgs.from_dict(cfg))
    dt = getattr(mx, a.dtype)
    model.update(tree_map(lambda p: p.astype(dt), model.parameters()))
    mx.eval(model.parameters())
    a.out.mkdir(parents=True, exist_ok=True)
    save_model(a.out, model)
    save_config(cfg, a.out / "config.json")
    if a.tokenizer_from:
        for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
            if (a.tokenizer_from / f).exists():
                shutil.copy(a.tokenizer_from / f, a.out / f)
    print("made", a.out, json.dumps(PRESETS[a.preset]))


if __name__ == "__main__":
    main()
