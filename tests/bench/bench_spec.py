"""Speculative decoding, ours vs mlx-lm, on the same folders and prompt:
plain decode, a self-draft (full acceptance) and each second model as draft.

Usage: bench_spec.py --host BIN --plugins DIR --model DIR --draft NAME=DIR [--draft ...]
                     [--gen 128] [--k 3] [--no-self]
Prints decode tokens/s for each engine and setup, with acceptance, and why
our request stopped speculating when it did.
"""
import argparse
import json
import random
import subprocess

from mlx_lm import load, stream_generate
from mlx_lm.sample_utils import make_sampler


def ours(a, draft, ids):
    cmd = [a.host, "generate", "--plugins", a.plugins, "--model", a.model, "--prompt-ids", ",".join(map(str, ids)),
           "--max-tokens", str(a.gen), "--ignore-eos", "--json", "--warmup"]
    if draft:
        cmd += ["--draft-model", draft, "--num-draft-tokens", str(a.k)]
    d = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    sp = d.get("speculation") or {}
    return d["decode_tokens_per_s"], sp.get("acceptance"), d["tokens"], sp.get("disabled")


def theirs(model, tok, draft, ids, a):
    kw = dict(draft_model=draft, num_draft_tokens=a.k) if draft is not None else {}
    last, toks, acc = None, [], 0
    for r in stream_generate(model, tok, ids, max_tokens=a.gen, sampler=make_sampler(0.0), **kw):
        last = r
        toks.append(r.token)
        acc += int(getattr(r, "from_draft", False))
    return last.generation_tps, acc / max(1, len(toks)), toks


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", required=True)
    ap.add_argument("--plugins", default="plugins")
    ap.add_argument("--model", required=True)
    ap.add_argument("--draft", action="append", required=True, help="NAME=DIR")
    ap.add_argument("--no-self", action="store_true")
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--k", type=int, default=3)
    a = ap.parse_args()
    rng = random.Random(0)
    ids = [rng.randrange(100, 49000) for _ in range(64)]
    m, tok = load(a.model)
    drafts = [tuple(d.split("=", 1)) for d in a.draft]
    setups = ([] if a.no_self else [("self-draft", a.model, m)]) + [(n, d, load(d)[0]) for n, d in drafts]
    rows = []
    base_o = ours(a, None, ids)
    # Warm-ups run a longer prompt, untimed: kernels get compiled, but no
    # shape of the measured run was seen before (as `host generate --warmup`).
    longer = (ids * 8)[: len(ids) + a.gen + 16]
    theirs(m, tok, None, longer, a)
    base_t = theirs(m, tok, None, ids, a)
    for name, d_ours, d_theirs in setups:
        o = ours(a, d_ours, ids)
        theirs(m, tok, d_theirs, longer, a)
        t = theirs(m, tok, d_theirs, ids, a)
        assert o[2] == base_o[2], f"{name}: our greedy output changed with the drafter"
        rows.append((name, o, t))
    print("| setup | ours decode tok/s (acceptance) | vs plain | mlx-lm decode tok/s (accepted share) | vs plain |")
    print("|---|---|---|---|---|")
    print(f"| plain | {base_o[0]:.1f} | 1.00x | {base_t[0]:.1f} | 1.00x |")
    for name, o, t in rows:
        print(f"| {name} (k={a.k}) | {o[0]:.1f} ({o[1]:.0%}) | {o[0] / base_o[0]:.2f}x | {t[0]:.1f} ({t[1]:.0%}) | {t[0] / base_t[0]:.2f}x |")
    for name, o, _ in rows:
        if o[3]:
            print(f"- {name}: {o[3]}")
    print(f"(64 prompt ids, {a.gen} generated, greedy; our outputs with drafters equal our plain output)")


if __name__ == "__main__":
    main()
