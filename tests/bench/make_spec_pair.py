"""Makes a target/draft pair for two-model speculation benchmarks on a machine
without a model hub: a cheap draft that mostly agrees with an expensive target,
as a distilled draft does for a real model.

The draft is a random-weight Qwen3 of the 0.6B shape cut to `--draft-layers`
layers. The target has the same embeddings, first layers, final norm and head,
plus `--target-layers - --draft-layers` more layers whose output projections
(o_proj, down_proj) are scaled by `--eps`: they cost a full layer each but only
nudge the residual stream, so the target's greedy choice usually equals the
draft's. The agreement printed (the share of positions along the target's own
greedy continuation where both pick the same token) is what a greedy
speculative round can accept; it falls as --eps grows.

Usage: make_spec_pair.py --out DIR [--draft-layers 2] [--target-layers 28] [--eps 0.05]
Writes DIR/target and DIR/draft (bfloat16, SmolLM2 vocabulary size, so the
tokenizer files can be copied in with --tokenizer-from).
"""
import argparse
import json
import shutil
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten, tree_map
from mlx_lm.models import qwen3
from mlx_lm.utils import save_config, save_model

SHAPE = dict(hidden_size=1024, intermediate_size=3072, num_attention_heads=16, num_key_value_heads=8, head_dim=128)


def config(layers):
    return dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"], vocab_size=49152, rms_norm_eps=1e-6,
                rope_theta=1000000.0, max_position_embeddings=40960, tie_word_embeddings=True,
                torch_dtype="bfloat16", eos_token_id=2, bos_token_id=1, num_hidden_layers=layers, **SHAPE)


def build(layers, seed):
    mx.random.seed(seed)
    m = qwen3.Model(qwen3.ModelArgs.from_dict(config(layers)))
    m.update(tree_map(lambda p: p.astype(mx.bfloat16), m.parameters()))
    return m


def agreement(target, draft, prompt, n):
    """Greedy continuation of the target, then both models' argmax at every position of it."""
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(mx.argmax(target(mx.array([ids]))[0, -1]).item()))
    x = mx.array([ids[:-1]])
    t, d = mx.argmax(target(x)[0], -1), mx.argmax(draft(x)[0], -1)
    start = len(prompt) - 1
    return float(mx.mean((t[start:] == d[start:]).astype(mx.float32)).item())


def save(model, layers, out, tok):
    out.mkdir(parents=True, exist_ok=True)
    save_model(out, model)
    save_config(config(layers), out / "config.json")
    if tok:
        for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
            if (tok / f).exists():
                shutil.copy(tok / f, out / f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--draft-layers", type=int, default=2)
    ap.add_argument("--target-layers", type=int, default=28)
    ap.add_argument("--eps", type=float, default=0.05)
    ap.add_argument("--tokenizer-from", type=Path)
    ap.add_argument("--check-tokens", type=int, default=48)
    a = ap.parse_args()
    draft = build(a.draft_layers, 0)
    target = build(a.target_layers, 1)
    # Shared: embeddings (tied head), final norm, and the draft's layers.
    shared = dict(tree_flatten(draft.parameters()))
    scaled = {}
    for k, v in tree_flatten(target.parameters()):
        parts = k.split(".")
        if k.startswith("model.layers.") and int(parts[2]) >= a.draft_layers and parts[-2] in ("o_proj", "down_proj"):
            scaled[k] = (v.astype(mx.float32) * a.eps).astype(mx.bfloat16)
    target.load_weights(list(shared.items()) + list(scaled.items()), strict=False)
    mx.eval(target.parameters(), draft.parameters())
    prompt = [int(x) for x in mx.random.randint(100, 49000, (32,), key=mx.random.key(7)).tolist()]
    agree = agreement(target, draft, prompt, a.check_tokens)
    save(target, a.target_layers, a.out / "target", a.tokenizer_from)
    save(draft, a.draft_layers, a.out / "draft", a.tokenizer_from)
    print(json.dumps({"target_layers": a.target_layers, "draft_layers": a.draft_layers, "eps": a.eps, "greedy_agreement": round(agree, 3)}))


if __name__ == "__main__":
    main()
