"""Turns a tiny random folder into one whose greedy output mostly cycles.

    python models/scripts/make_cycle.py SRC DST [--scale 0.03]

Speculation tests need drafts that are sometimes right and sometimes wrong,
at positions that differ between requests; a random model never repeats
itself, so n-gram drafts over its output are all rejected. This copy unties
the output head and sets it so that the embedding of token c scores token
next(c) on the cycle 1000 -> 1001 -> ... -> 1006 -> 1000 (every other head
row is zero), and scales every layer's output projection by `--scale`: the
layers (recurrent state included) still move every logit, and now and then
they move the argmax off the cycle, depending on the context. Prompt lookup
then accepts runs of different lengths.
"""

import argparse
import json
import shutil

import mlx.core as mx

CYCLE = list(range(1000, 1007))
OUTPUTS = ("out_proj.weight", "o_proj.weight", "down_proj.weight")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--scale", type=float, default=0.03)
    args = ap.parse_args()
    w = mx.load(f"{args.src}/model.safetensors")
    prefix = next(k for k in w if k.endswith("embed_tokens.weight"))[: -len("model.embed_tokens.weight")]
    emb = w[f"{prefix}model.embed_tokens.weight"]
    head = mx.zeros(emb.shape, emb.dtype)
    head[mx.array(CYCLE)] = emb[mx.array(CYCLE[-1:] + CYCLE[:-1])]
    w[f"{prefix}lm_head.weight"] = head
    for k in [k for k in w if k.endswith(OUTPUTS)]:
        w[k] = w[k] * args.scale
    mx.save_safetensors(f"{args.dst}/model.safetensors", w)
    with open(f"{args.src}/config.json") as f:
        cfg = json.load(f)
    cfg["tie_word_embeddings"] = False
    with open(f"{args.dst}/config.json", "w") as f:
        json.dump(cfg, f, indent=1)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(f"{args.src}/{name}", args.dst)


if __name__ == "__main__":
    main()
