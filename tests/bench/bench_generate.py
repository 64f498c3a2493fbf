"""Prefill and decode tokens/s: `host generate` vs mlx-lm on the same model
folders, same prompt ids, same MLX runtime, one run, side by side.

Usage:
  bench_generate.py --host target/release/host --plugins plugins \
      --model models/smollm2-135m-instruct [--model ...] \
      [--prompt-len 512] [--gen 128] [--reps 2] [--dtype auto]

Run the Python with LD_LIBRARY_PATH pointing at the engine's libmlx folder
(`.mlx/lib`, or the CUDA wheel's) so both engines use the same runtime; the
script refuses to run otherwise. Prints a markdown table with ratios
(ours / mlx-lm; above 1 means we are faster). Each figure is the best of
`--reps` alternating runs; model loading is excluded on both sides, and each side runs the workload
once untimed first (on a GPU the first run also compiles kernels).
"""
import argparse
import json
import random
import subprocess
import sys
import time

import mlx.core as mx
from mlx_lm import load, stream_generate
from mlx_lm.sample_utils import make_sampler


def ours(a, model, ids):
    out = subprocess.run(
        [a.host, "generate", "--plugins", a.plugins, "--model", model, "--prompt-ids", ",".join(map(str, ids)),
         "--max-tokens", str(a.gen), "--ignore-eos", "--json", "--warmup", "--dtype", a.dtype],
        check=True, capture_output=True, text=True).stdout
    d = json.loads(out)
    assert len(d["tokens"]) == a.gen, d
    return d["prefill_tokens_per_s"], d["decode_tokens_per_s"], d["compute_dtype"]


def theirs(m, tok, ids, gen):
    last = None
    for r in stream_generate(m, tok, ids, max_tokens=gen, sampler=make_sampler(0.0)):
        last = r
    assert last.generation_tokens == gen, last.generation_tokens
    return last.prompt_tps, last.generation_tps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", required=True)
    ap.add_argument("--plugins", default="plugins")
    ap.add_argument("--model", action="append", required=True)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--dtype", default="auto")
    a = ap.parse_args()
    libs = sorted({l.split()[-1] for l in open("/proc/self/maps") if l.rstrip().endswith("/libmlx.so")})
    print(f"mlx {mx.__version__}, libmlx {libs}, device {mx.default_device()}", file=sys.stderr)
    rows = []
    for model in a.model:
        m, tok = load(model)
        vocab = json.load(open(f"{model}/config.json"))["vocab_size"]
        rng = random.Random(0)
        ids = [rng.randrange(100, vocab - 1) for _ in range(a.prompt_len)]
        # Both sides time prefills of lengths they have not run before, as a
        # server meets them: ours warms up on a longer prompt in each fresh
        # process (`--warmup`); mlx-lm warms up once on that longer prompt
        # and each rep drops one more token, so no timed length repeats.
        theirs(m, tok, (ids * 3)[:len(ids) + a.gen + 16], a.gen)
        best_o, best_t, dt = (0, 0), (0, 0), "?"
        for r in range(a.reps):
            rep_ids = ids[:len(ids) - r]
            p, d, dt = ours(a, model, rep_ids)
            best_o = (max(best_o[0], p), max(best_o[1], d))
            p, d = theirs(m, tok, rep_ids, a.gen)
            best_t = (max(best_t[0], p), max(best_t[1], d))
        rows.append((model, dt, best_o, best_t))
        del m
    print(f"| model | ours dtype | prefill ours / mlx-lm (tok/s) | ratio | decode ours / mlx-lm (tok/s) | ratio |")
    print("|---|---|---|---|---|---|")
    for model, dt, o, t in rows:
        print(f"| {model.rstrip('/').split('/')[-1]} | {dt} | {o[0]:.1f} / {t[0]:.1f} | {o[0] / t[0]:.2f}x | {o[1]:.1f} / {t[1]:.1f} | {o[1] / t[1]:.2f}x |")
    print(f"(prompt {a.prompt_len} tokens, {a.gen} generated, greedy, best of {a.reps})")


if __name__ == "__main__":
    main()
