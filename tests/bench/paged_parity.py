"""Greedy output of `host serve --paged-kv` against plain K/V on one model
folder, on whatever device the runtime has: N concurrent completions whose
prompts differ in length (uneven rows: the view aligns them by blocks under
a mask), `max_tokens` each. Every completion's tokens must be equal.

    paged_parity.py --host H --plugins P --model DIR [--clients 8] [--max-tokens 64] [--even] [--extra "..."]

--even gives every prompt the same length (different ids): then the paged
view has kv-plain's geometry exactly and the tokens must be equal bit for
bit on any device; uneven rows are aligned by whole blocks, so on a GPU
their attention runs over other key lengths than kv-plain's left padding,
which may round differently in bf16.

Prints one line per client and `paged parity: N/N equal`; exits 1 on any
difference.
"""
import argparse
import json
import subprocess
import sys
import threading
import urllib.request

from bench_http import free_port, wait_ready

ap = argparse.ArgumentParser()
ap.add_argument("--host", required=True)
ap.add_argument("--plugins", required=True)
ap.add_argument("--model", required=True)
ap.add_argument("--clients", type=int, default=8)
ap.add_argument("--max-tokens", type=int, default=64)
ap.add_argument("--even", action="store_true")
ap.add_argument("--extra", default="", help="more `host serve` arguments for both servers")
a = ap.parse_args()


def completions(paged):
    port = free_port()
    cmd = [a.host, "serve", "--plugins", a.plugins, "--model", a.model, "--port", str(port)] + a.extra.split()
    p = subprocess.Popen(cmd + (["--paged-kv"] if paged else []), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(port, "/health", p)
        out = [None] * a.clients

        def ask(i):
            # Prompts of 37 + 53 i token ids (every row a different length),
            # or all of 300 with --even.
            n = 300 if a.even else 37 + 53 * i
            ids = [(i * 131 + k * 17) % 3000 + 100 for k in range(n)]
            body = {"prompt": ids, "max_tokens": a.max_tokens, "temperature": 0}
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
            r = json.load(urllib.request.urlopen(req, timeout=600))
            out[i] = r["choices"][0].get("token_ids") or r["choices"][0]["text"]

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(a.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return out
    finally:
        p.terminate()
        p.wait()


plain, paged = completions(False), completions(True)
equal = 0
for i, (x, y) in enumerate(zip(plain, paged)):
    same = x == y
    equal += same
    print(f"client {i}: {'equal' if same else 'DIFFERENT'}")
print(f"paged parity: {equal}/{a.clients} equal")
sys.exit(0 if equal == a.clients else 1)
