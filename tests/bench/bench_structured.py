"""Constrained against free decoding through HTTP: aggregate decode
throughput of N concurrent requests under a JSON Schema against the same N
requests without one, on one server, bursts interleaved over --reps.

Usage: bench_structured.py --host H --plugins P --model DIR [--concurrency 8]
    [--gen 256] [--reps 3] [--extra="SERVE FLAGS"]
Prompts are token ids (random-weight folders rarely sample EOS, so both
kinds of burst run to --gen); the schema asks for a long array of objects
so the grammar does not end first. Prints per kind the median aggregate
tok/s (completion tokens of the burst / its wall time), the ratio, the
share of bursts that ran to max_tokens, and the grammar's mask time per
masked step from /metrics."""
import argparse
import json
import re
import statistics
import threading
import time
import urllib.request

import host_server

SCHEMA = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {"id": {"type": "integer"}, "name": {"type": "string", "maxLength": 12}, "ok": {"type": "boolean"}},
        "required": ["id", "name", "ok"],
    },
    "minItems": 500,
}


def post(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=900).read())


def metrics(port):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    get = lambda name: float(re.search(rf"^mlx_engine_{name} (\S+)", text, re.M).group(1))
    return get("grammar_masks_total"), get("grammar_mask_seconds_total"), get("grammar_accept_seconds_total")


def serve(a, port):
    cmd = [a.host, "serve", "--plugins", a.plugins, "--model", a.model, "--port", str(port), "--batch", str(a.concurrency)] + a.extra.split()
    return host_server.start(cmd, port)


def burst(port, n, gen, constrained):
    out = [None] * n

    def one(i):
        body = {"prompt": [1000 + 7 * i + j for j in range(16)], "max_tokens": gen, "temperature": 0}
        if constrained:
            body["guided_json"] = SCHEMA
        out[i] = post(port, body)

    ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    t0 = time.perf_counter()
    [t.start() for t in ts]
    [t.join() for t in ts]
    wall = time.perf_counter() - t0
    tokens = sum(r["usage"]["completion_tokens"] for r in out)
    full = all(r["choices"][0]["finish_reason"] == "length" for r in out)
    return tokens / wall, full


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", required=True)
    ap.add_argument("--plugins", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--gen", type=int, default=256)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--port", type=int, default=18555)
    ap.add_argument("--extra", default="")
    a = ap.parse_args()
    p = serve(a, a.port)
    try:
        burst(a.port, a.concurrency, 16, False)  # warm-up
        burst(a.port, a.concurrency, 16, True)  # and the token trie
        m0 = metrics(a.port)
        rates = {False: [], True: []}
        full = {False: 0, True: 0}
        for _ in range(a.reps):
            for constrained in (False, True):
                rate, f = burst(a.port, a.concurrency, a.gen, constrained)
                rates[constrained].append(rate)
                full[constrained] += f
        m1 = metrics(a.port)
    finally:
        p.terminate()
        p.wait()
    free, cons = statistics.median(rates[False]), statistics.median(rates[True])
    masks = m1[0] - m0[0]
    print(f"model {a.model}, {a.concurrency} concurrent, {a.gen} tokens each, {a.reps} reps")
    print(f"free        {free:9.1f} tok/s  (bursts to max_tokens: {full[False]}/{a.reps})")
    print(f"json_schema {cons:9.1f} tok/s  (bursts to max_tokens: {full[True]}/{a.reps})")
    print(f"ratio       {cons / free:9.3f}")
    print(f"mask time   {1e3 * (m1[1] - m0[1]) / max(masks, 1):9.3f} ms per mask ({int(masks)} masks)")
    print(f"accept time {1e3 * (m1[2] - m0[2]) / max(masks, 1):9.3f} ms per token")


main()
