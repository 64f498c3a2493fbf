#!/usr/bin/env python3
"""Reference embeddings for a sentence-transformers folder, computed with
mlx-lm's model and sentence-transformers' pooling rules.

    python models/scripts/embed_oracle.py --model DIR --inputs inputs.json --out ref.json

inputs.json is a list whose items are strings (tokenized as
sentence-transformers does: the tokenizer's own special tokens added) or
lists of token ids. Each input runs alone (no padding) through
`model.model`, mlx-lm's decoder stack, which ends with the final norm: the
hidden states sentence-transformers' Transformer module hands on
(`last_hidden_state`). The pooling mode and normalisation are read from the
folder's `modules.json` and the Pooling module's `config.json`, then applied
in float32 as sentence-transformers does (mean: sum / count; lasttoken: the
last position; cls: the first; Normalize: x / max(|x|, 1e-12)).

Writes JSON with `ids` (per input), `embeddings` (per input), `pooling`,
`normalize` and `libmlx` (the libmlx.so this process mapped).
"""

import argparse
import json
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx_lm.utils import load

MODES = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_lasttoken": "lasttoken",
}


def read_pipeline(folder: Path):
    modules = json.loads((folder / "modules.json").read_text())
    pooling_path = next(m["path"] for m in modules if m["type"].endswith("Pooling"))
    normalize = any(m["type"].endswith("Normalize") for m in modules)
    cfg = json.loads((folder / pooling_path / "config.json").read_text())
    modes = [name for key, name in MODES.items() if cfg.get(key)]
    assert len(modes) == 1, f"one supported pooling mode expected, got {cfg}"
    return modes[0], normalize


def pool(hidden: np.ndarray, mode: str) -> np.ndarray:
    if mode == "cls":
        return hidden[0]
    if mode == "lasttoken":
        return hidden[-1]
    return hidden.sum(axis=0) / max(hidden.shape[0], 1e-9)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--inputs", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args()

    mode, normalize = read_pipeline(args.model)
    model, tokenizer = load(str(args.model))
    ids_all, vectors = [], []
    for item in json.loads(args.inputs.read_text()):
        ids = tokenizer.encode(item) if isinstance(item, str) else [int(t) for t in item]
        hidden = model.model(mx.array([ids]))[0].astype(mx.float32)
        v = pool(np.array(hidden), mode).astype(np.float32)
        if normalize:
            v = v / max(float(np.linalg.norm(v)), 1e-12)
        ids_all.append(ids)
        vectors.append(v.tolist())
    result = {
        "pooling": mode,
        "normalize": normalize,
        "ids": ids_all,
        "embeddings": vectors,
        "libmlx": sorted({l.split()[-1] for l in open("/proc/self/maps") if l.rstrip().endswith("/libmlx.so")}),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result))
    print(f"{args.model}: {len(vectors)} embeddings ({mode}{', normalized' if normalize else ''}) -> {args.out}")


if __name__ == "__main__":
    main()
