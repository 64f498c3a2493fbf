#!/usr/bin/env python3
"""Turn a model folder into a sentence-transformers embedding folder.

    python models/scripts/make_embedding.py SRC DST --pooling last|mean|cls [--no-normalize]

Copies SRC's files (weights, config, tokenizer) into DST and writes what
sentence-transformers reads to pool a decoder's final hidden states into one
vector: `modules.json` (Transformer -> Pooling [-> Normalize]),
`1_Pooling/config.json` with the one pooling mode set, `2_Normalize/`,
`sentence_bert_config.json` and `config_sentence_transformers.json`, as
Qwen3-Embedding's folders have them. The weights are left alone: a tiny
random decoder pools as well as a trained one for parity tests.
"""

import argparse
import json
import shutil
from pathlib import Path

MODES = {
    "cls": "pooling_mode_cls_token",
    "mean": "pooling_mode_mean_tokens",
    "last": "pooling_mode_lasttoken",
}
ALL_MODES = [
    "pooling_mode_cls_token",
    "pooling_mode_mean_tokens",
    "pooling_mode_max_tokens",
    "pooling_mode_mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens",
    "pooling_mode_lasttoken",
]


def write_json(path: Path, value) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("dst", type=Path)
    ap.add_argument("--pooling", choices=sorted(MODES), required=True)
    ap.add_argument("--no-normalize", action="store_true")
    args = ap.parse_args()

    args.dst.mkdir(parents=True, exist_ok=True)
    for f in args.src.iterdir():
        if f.is_file():
            shutil.copy2(f, args.dst / f.name)
    config = json.loads((args.src / "config.json").read_text())

    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    if not args.no_normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
        (args.dst / "2_Normalize").mkdir(exist_ok=True)
    write_json(args.dst / "modules.json", modules)

    pooling = {"word_embedding_dimension": config["hidden_size"]}
    pooling.update({m: m == MODES[args.pooling] for m in ALL_MODES})
    pooling["include_prompt"] = True
    write_json(args.dst / "1_Pooling/config.json", pooling)
    write_json(args.dst / "sentence_bert_config.json", {"max_seq_length": 4096, "do_lower_case": False})
    write_json(
        args.dst / "config_sentence_transformers.json",
        {"prompts": {}, "default_prompt_name": None, "similarity_fn_name": "cosine"},
    )
    print(f"{args.dst}: {args.pooling} pooling{'' if args.no_normalize else ', normalized'}")


if __name__ == "__main__":
    main()
