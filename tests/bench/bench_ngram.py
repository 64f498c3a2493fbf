"""Plain vs n-gram speculative decoding on copy/edit chat prompts, ours
and mlx-lm (plain decoding: mlx-lm has no prompt-lookup drafter), one run
side by side on the same model folder and MLX runtime.

Usage: bench_ngram.py --host BIN --plugins DIR --model DIR [--gen 256] [--k 4,10]
Prints decode tokens/s, acceptance, and whether our outputs are identical
with and without the drafter (greedy: they must be).
"""
import argparse
import json
import subprocess
import time

from mlx_lm import load, stream_generate
from mlx_lm.sample_utils import make_sampler

TEXT = ("The quick brown fox jumps over the lazy dog. The dog sleeps under the old oak tree while the fox "
        "runs across the green field towards the river, where a family of ducks swims slowly in the sun.")
PROMPTS = [
    f"Repeat this text exactly, word for word:\n\n{TEXT}",
    f"Rewrite this text, replacing every 'fox' with 'cat' and changing nothing else:\n\n{TEXT}",
    "Here is a Python function:\n\ndef area(w, h):\n    return w * h\n\ndef perimeter(w, h):\n    return 2 * (w + h)\n\n"
    "Copy both functions, renaming w to width and h to height.",
]


def ours(a, chat, extra):
    cmd = [a.host, "generate", "--plugins", a.plugins, "--model", a.model, "--chat", chat, "--max-tokens", str(a.gen),
           "--json", "--warmup"] + extra
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def theirs(model, tok, chat, gen):
    ids = tok.apply_chat_template([{"role": "user", "content": chat}], add_generation_prompt=True)
    for _ in range(2):  # the first run warms up (and compiles kernels on a GPU)
        t0, last, n = None, None, 0
        for r in stream_generate(model, tok, ids, max_tokens=gen, sampler=make_sampler(0.0)):
            if t0 is None:
                t0 = time.perf_counter()
            n, last = n + 1, r
    return (n - 1) / (time.perf_counter() - t0), last.generation_tps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", required=True)
    ap.add_argument("--plugins", default="plugins")
    ap.add_argument("--model", required=True)
    ap.add_argument("--gen", type=int, default=256)
    ap.add_argument("--k", default="4,10")
    a = ap.parse_args()
    model, tok = load(a.model)
    print("| prompt | mlx-lm plain tok/s | ours plain tok/s | " + " | ".join(f"ours ngram k={k} tok/s (acceptance)" for k in a.k.split(",")) + " | same output |")
    print("|---|---|---|" + "---|" * len(a.k.split(",")) + "---|")
    for i, chat in enumerate(PROMPTS):
        mlx_tps, _ = theirs(model, tok, chat, a.gen)
        plain = ours(a, chat, [])
        cells, same = [], True
        for k in a.k.split(","):
            d = ours(a, chat, ["--draft-kind", "ngram", "--num-draft-tokens", k])
            sp = d.get("speculation") or {}
            cells.append(f"{d['decode_tokens_per_s']:.1f} ({sp.get('acceptance', 0):.2f}, x{d['decode_tokens_per_s'] / plain['decode_tokens_per_s']:.2f})")
            same = same and d["tokens"] == plain["tokens"]
        print(f"| copy/edit {i + 1} ({len(plain['tokens'])} tok) | {mlx_tps:.1f} | {plain['decode_tokens_per_s']:.1f} | " + " | ".join(cells) + f" | {same} |", flush=True)


if __name__ == "__main__":
    main()
