"""Latency and throughput through HTTP: `host serve` vs `mlx_lm.server` on
the same model folder, same machine, same request mix, one run.

Usage:
  bench_http.py --host target/release/host --plugins plugins --model DIR \
      [--requests 8] [--max-tokens 64] [--concurrency 1,4]

Starts both servers (each alone while it is measured), sends the same
streaming chat requests (greedy, fixed max_tokens) from N client threads,
and prints mean time to first token, mean request latency and aggregate
generated tokens/s, with ratios. Run with LD_LIBRARY_PATH at the engine's
libmlx folder so mlx_lm.server uses the same MLX runtime.
"""
import argparse
import http.client
import json
import socket
import subprocess
import sys
import threading
import time

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a hash map is in two sentences.",
    "List three prime numbers.",
    "Who wrote Hamlet?",
    "Give me a tip for learning to cook.",
    "What does a CPU do?",
    "Name a colour of the rainbow.",
]


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_ready(port, path, timeout=300):
    t = time.time()
    while time.time() - t < timeout:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", path)
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"server on {port} did not start")


def one(port, prompt, max_tokens):
    body = json.dumps({"model": "default_model", "messages": [{"role": "user", "content": prompt}], "temperature": 0,
                       "max_tokens": max_tokens, "stream": True, "stream_options": {"include_usage": True}})
    t0 = time.time()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200, r.read()
    ttft, tokens = None, 0
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        if ev.get("usage"):
            tokens = ev["usage"]["completion_tokens"]
        for ch in ev.get("choices", []):
            if ch.get("delta", {}).get("content") and ttft is None:
                ttft = time.time() - t0
    return ttft or (time.time() - t0), time.time() - t0, tokens


def load(port, n, conc, max_tokens):
    jobs = [PROMPTS[i % len(PROMPTS)] for i in range(n)]
    res, lock = [], threading.Lock()

    def worker():
        while True:
            with lock:
                if not jobs:
                    return
                p = jobs.pop()
            r = one(port, p, max_tokens)
            with lock:
                res.append(r)

    t0 = time.time()
    ts = [threading.Thread(target=worker) for _ in range(conc)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    wall = time.time() - t0
    ttft = sum(r[0] for r in res) / len(res)
    lat = sum(r[1] for r in res) / len(res)
    toks = sum(r[2] for r in res)
    return ttft, lat, toks / wall


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", required=True)
    ap.add_argument("--plugins", default="plugins")
    ap.add_argument("--model", required=True)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--extra", default="", help="extra flags for host serve")
    a = ap.parse_args()
    concs = [int(c) for c in a.concurrency.split(",")]
    results = {}
    servers = {
        "ours": lambda port: [a.host, "serve", "--plugins", a.plugins, "--model", a.model, "--port", str(port)] + a.extra.split(),
        "mlx_lm.server": lambda port: [sys.executable, "-m", "mlx_lm.server", "--model", a.model, "--port", str(port)],
    }
    for name, cmd in servers.items():
        port = free_port()
        p = subprocess.Popen(cmd(port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_ready(port, "/health" if name == "ours" else "/v1/models")
            one(port, "warm up", 4)
            for c in concs:
                results[(name, c)] = load(port, a.requests, c, a.max_tokens)
        finally:
            p.terminate()
            p.wait(timeout=30)
    print("| clients | TTFT ours / mlx_lm.server (ms) | latency ours / mlx_lm.server (s) | aggregate tok/s ours / mlx_lm.server | throughput ratio |")
    print("|---|---|---|---|---|")
    for c in concs:
        o, t = results[("ours", c)], results[("mlx_lm.server", c)]
        print(f"| {c} | {o[0]*1e3:.0f} / {t[0]*1e3:.0f} | {o[1]:.2f} / {t[1]:.2f} | {o[2]:.1f} / {t[2]:.1f} | {o[2] / t[2]:.2f}x |")
    print(f"({a.requests} streaming chat requests per row, greedy, max_tokens {a.max_tokens})")


if __name__ == "__main__":
    main()
