"""Greedy output of rows decoded together against the same requests decoded
one at a time, on one `host serve` (prefix cache off), on whatever device
the runtime has: N concurrent completions whose prompts differ in length (a
left-padded batch: every decode step masks the padding), then each alone.

    batch_parity.py --host H --plugins P --model DIR [--clients 8] [--max-tokens 64] [--extra "..."]
        [--server-log FILE]

Prints one line per client (equal, or the first position where the tokens
part) and `batch parity: N/N equal`; exits 1 on any difference, and on an
error reply with its status and body. On a GPU a
batched step and a serial one attend through different kernels (masked and
unmasked), so bf16 rounding may part a row whose two best tokens are close.
"""
import argparse
import json
import subprocess
import sys
import threading
import urllib.error
import urllib.request

from bench_http import free_port, wait_ready

ap = argparse.ArgumentParser()
ap.add_argument("--host", required=True)
ap.add_argument("--plugins", required=True)
ap.add_argument("--model", required=True)
ap.add_argument("--clients", type=int, default=8)
ap.add_argument("--max-tokens", type=int, default=64)
ap.add_argument("--extra", default="", help="more `host serve` arguments")
ap.add_argument("--server-log", default=None, help="write the server's stderr here")
a = ap.parse_args()


def prompt(i):
    # 37 + 53 i token ids: every row a different length.
    return [(i * 131 + k * 17) % 3000 + 100 for k in range(37 + 53 * i)]


def complete(port, i):
    body = {"prompt": prompt(i), "max_tokens": a.max_tokens, "temperature": 0}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        r = json.load(urllib.request.urlopen(req, timeout=600))
    except urllib.error.HTTPError as e:
        raise RuntimeError(f"client {i}: HTTP {e.code}: {e.read().decode(errors='replace')}") from None
    return r["choices"][0].get("token_ids") or r["choices"][0]["text"]


port = free_port()
cmd = [a.host, "serve", "--plugins", a.plugins, "--model", a.model, "--port", str(port),
       "--batch", str(a.clients), "--prompt-cache", "0"] + a.extra.split()
log = open(a.server_log, "w") if a.server_log else subprocess.DEVNULL
p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
try:
    wait_ready(port, "/health", p)
    together = [None] * a.clients

    errors = []

    def ask(i):
        try:
            together[i] = complete(port, i)
        except RuntimeError as e:
            errors.append(str(e))

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        sys.exit("\n".join(errors))
    alone = [complete(port, i) for i in range(a.clients)]
finally:
    p.terminate()
    p.wait()
    if a.server_log:
        log.close()

equal = 0
for i, (x, y) in enumerate(zip(together, alone)):
    if x == y:
        equal += 1
        print(f"client {i}: equal")
    else:
        at = next((k for k, (u, v) in enumerate(zip(x, y)) if u != v), min(len(x), len(y)))
        print(f"client {i}: parts at token {at}")
print(f"batch parity: {equal}/{a.clients} equal")
sys.exit(0 if equal == a.clients else 1)
