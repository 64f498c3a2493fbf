"""Batched speculation through HTTP: aggregate decode throughput of N
concurrent greedy requests with and without a drafter, one server per
variant (interleaved over --reps), outputs compared with the plain run's.

Usage: bench_spec_batch.py --host H --plugins P --model DIR [--concurrency 4]
    [--gen 96] [--reps 3] [--extra="FLAGS"] [--variant "name=--draft-kind ngram ..."]...
--extra flags go to every server (e.g. --extra="--model-option conv=mlx"),
a variant's only to its own.
Prompts are token ids on the 1000..1006 cycle of make_cycle.py folders, each
seeding prompt lookup with a different wrong turn (as the batched test does).
Prints per variant the median aggregate tok/s (generated tokens of all
requests / wall time of the burst), its ratio to plain, and the summed
speculation counters."""
import argparse
import json
import statistics
import threading
import time
import urllib.request

import host_server

PROMPTS = [
    [1000, 1001, 1002, 1003, 5, 6, 7, 1000, 1001, 1002],
    [1004, 1005, 1006, 1000, 1001, 1002, 1003, 1004],
    [1001, 1002, 9, 1005, 1006, 1000, 1001],
    [1003, 1004, 1005, 1006, 1000, 1001, 1002, 1003, 1004, 1005, 1006, 1000, 1001, 1002, 1003],
    [1006, 1000, 1001, 40, 41, 42, 1006, 1000],
    [1002, 1003, 1004, 1005, 1006, 1000],
    [1005, 1006, 70, 1001, 1002, 1003, 1005, 1006],
    [1000, 1002, 1004, 1006, 1001, 1003, 1005, 1000],
]


def post(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=600).read())


def serve(a, extra, port):
    cmd = [a.host, "serve", "--plugins", a.plugins, "--model", a.model, "--port", str(port), "--batch", "8"] + a.extra.split() + extra
    return host_server.start(cmd, port)


def burst(port, n, gen, offset):
    out = [None] * n
    def one(i):
        p = PROMPTS[(i + offset) % len(PROMPTS)]
        out[i] = post(port, {"prompt": p, "max_tokens": gen, "temperature": 0})
    ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    t0 = time.perf_counter()
    [t.start() for t in ts]
    [t.join() for t in ts]
    return time.perf_counter() - t0, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", required=True)
    ap.add_argument("--plugins", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--gen", type=int, default=96)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--extra", default="", help="flags for every host serve")
    ap.add_argument("--variant", action="append", default=[])
    a = ap.parse_args()
    variants = [("plain", [])] + [(v.split("=", 1)[0], v.split("=", 1)[1].split()) for v in a.variant]
    rates = {n: [] for n, _ in variants}
    spec = {n: [0, 0, 0] for n, _ in variants}
    texts = {}
    port = 18900
    for rep in range(a.reps):
        for name, extra in variants:
            port += 1
            p = serve(a, extra, port)
            try:
                burst(port, a.concurrency, 8, 3)  # warm-up: other prompts, other lengths
                secs, out = burst(port, a.concurrency, a.gen, 0)
            finally:
                p.terminate()
                p.wait()
            toks = sum(o["usage"]["completion_tokens"] for o in out)
            rates[name].append(toks / secs)
            for o in out:
                sp = o["usage"].get("speculation") or {}
                for j, k in enumerate(("drafted", "accepted", "rounds")):
                    spec[name][j] += sp.get(k, 0)
            got = [o["choices"][0]["text"] for o in out]
            texts.setdefault(name, got)
            same = "same as plain" if got == texts["plain"] else "DIFFERS from plain"
            print(f"rep {rep} {name}: {toks / secs:.1f} tok/s ({toks} tokens, {secs:.2f} s), {same}", flush=True)
    base = statistics.median(rates["plain"])
    print(f"| variant ({a.concurrency} concurrent, {a.gen} tokens each) | aggregate tok/s (median of {a.reps}) | vs plain | drafted / accepted / rounds |")
    print("|---|---|---|---|")
    for name, _ in variants:
        m = statistics.median(rates[name])
        d, acc, r = spec[name]
        print(f"| {name} | {m:.1f} | {m / base:.2f}x | {d} / {acc} / {r} |")


if __name__ == "__main__":
    main()
