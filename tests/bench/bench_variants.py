"""A/B of `host generate` variants on one model and prompt: each variant
runs `--reps` times in its own process, interleaved with the others (the
H200's speed drifts between processes), and the table gives the median
decode tokens/s, its ratio to the first variant's median, the median
prefill tokens/s (a prompt length new to the process), what speculation
did, and whether every output equals the first variant's.

Usage: bench_variants.py --host BIN --plugins DIR --model DIR (--prompt-ids IDS | --chat TEXT)
       [--gen 128] [--reps 3] [--stop-at-eos] --variant "NAME=ARGS" ...
The first variant is the reference. ARGS are `host generate` flags (e.g.
`--draft-kind ngram --speculate-always`, `--model-option conv=mlx`,
`--gpu-attention mlx`); tokens `env:NAME=VALUE` set that variant's
environment instead (MLX's own switches: `env:MLX_DISABLE_COMPILE=1`,
`env:MLX_MAX_OPS_PER_BUFFER=80`).
"""
import argparse
import json
import os
import shlex
import statistics
import subprocess


def run(a, extra):
    env = dict(os.environ, **dict(t[4:].split("=", 1) for t in extra if t.startswith("env:")))
    extra = [t for t in extra if not t.startswith("env:")]
    src = ["--prompt-ids", a.prompt_ids] if a.prompt_ids else ["--chat", a.chat]
    cmd = [a.host, "generate", "--plugins", a.plugins, "--model", a.model, *src, "--max-tokens", str(a.gen),
           "--json", "--warmup", *([] if a.stop_at_eos else ["--ignore-eos"]), *extra]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", required=True)
    ap.add_argument("--plugins", default="plugins")
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompt-ids")
    ap.add_argument("--chat")
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--stop-at-eos", action="store_true", help="end at the model's EOS (chat answers) instead of --gen tokens")
    ap.add_argument("--variant", action="append", required=True, help="NAME=ARGS")
    a = ap.parse_args()
    if not (a.prompt_ids or a.chat):
        ap.error("give --prompt-ids or --chat")
    variants = [(v.split("=", 1)[0], shlex.split(v.split("=", 1)[1])) for v in a.variant]
    runs = {name: [] for name, _ in variants}
    for rep in range(a.reps):
        for name, extra in variants[rep % len(variants):] + variants[:rep % len(variants)]:
            runs[name].append(run(a, extra))
    ref_name = variants[0][0]
    ref_tokens = runs[ref_name][0]["tokens"]
    ref = statistics.median(r["decode_tokens_per_s"] for r in runs[ref_name])
    print("| variant | decode tok/s (median; all) | vs " + ref_name + " | prefill tok/s (median) | acceptance | rounds | fell back | same output |")
    print("|---|---|---|---|---|---|---|---|")
    for name, _ in variants:
        rs = runs[name]
        tps = [r["decode_tokens_per_s"] for r in rs]
        sp = rs[-1].get("speculation") or {}
        acc = f"{sp['acceptance']:.2f}" if sp else "-"
        rounds = str(sp.get("rounds", 0)) if sp else "-"
        fell = sp["disabled"] if sp.get("disabled") else "no" if sp else "-"
        same = all(r["tokens"] == ref_tokens for r in rs)
        med = statistics.median(tps)
        pre = statistics.median(r["prefill_tokens_per_s"] for r in rs)
        print(f"| {name} | **{med:.1f}**; {', '.join(f'{t:.0f}' for t in tps)} | {med / ref:.2f}x | {pre:.0f} | {acc} | {rounds} | {fell} | {same} |", flush=True)


if __name__ == "__main__":
    main()
