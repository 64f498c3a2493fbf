"""The server comparison: `host serve` against `mlx_lm.server` on the same
model folder, same machine, same request mix, in one run.

Usage:
  bench_http.py --host target/release/host --plugins plugins --model DIR \
      [--concurrency 1,8,32,64] [--per-client 2] [--max-tokens 128] \
      [--prompt-words 0] [--extra="--batch 32"] [--mlx-args="--decode-concurrency 64"] \
      [--servers ours,mlx_lm] [--json OUT.json] [--server-log PATH]

`--servers` names any of: ours, isolated (ours with --isolate: the cost of
engine isolation), mlx_lm.

Each server runs alone while it is measured. For each concurrency C, C client
threads each send `--per-client` streaming chat requests (greedy, fixed
max_tokens; the prompts differ per request so no two share more than the
template's prefix). Every failure is counted, by kind: an HTTP status other
than 200, a connection reset or refused, a timeout, a stream cut before its
end. Reported per server and concurrency: requests ok and failed, time to
first token (mean and p95), request latency (mean and p95) and aggregate
generated tokens/s over the wall time of the whole burst; then the ratio of
aggregate throughputs. Run with LD_LIBRARY_PATH at the engine's libmlx folder
so mlx_lm.server uses the same MLX runtime.
"""
import argparse
import http.client
import json
import socket
import subprocess
import sys
import threading
import time
from collections import Counter

TOPICS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a hash map is in two sentences.",
    "List three prime numbers.",
    "Who wrote Hamlet?",
    "Give me a tip for learning to cook.",
    "What does a CPU do?",
    "Name a colour of the rainbow.",
]
FILLER = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa".split()


def prompt(i, words):
    """Request i's prompt: a topic, a request number (so prompts differ past
    the template) and `words` filler words for longer prompts."""
    body = " ".join(FILLER[(i * 7 + k) % len(FILLER)] for k in range(words))
    return f"Request {i}. {TOPICS[i % len(TOPICS)]} {body}".strip()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_ready(port, path, proc=None, timeout=600):
    t = time.time()
    while time.time() - t < timeout:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server on {port} exited with {proc.returncode}")
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", path)
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"server on {port} did not start")


class Outcome:
    """One request: ok with (ttft, latency, tokens), or the kind of failure."""

    def __init__(self, ok=False, ttft=0.0, latency=0.0, tokens=0, error=None):
        self.ok, self.ttft, self.latency, self.tokens, self.error = ok, ttft, latency, tokens, error


def one(port, text, max_tokens, timeout):
    body = json.dumps({"model": "default_model", "messages": [{"role": "user", "content": text}], "temperature": 0,
                       "max_tokens": max_tokens, "stream": True, "stream_options": {"include_usage": True}})
    t0 = time.time()
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        c.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            r.read()
            return Outcome(error=f"http {r.status}")
        ttft, tokens, pieces, done = None, 0, 0, False
        for raw in r:
            line = raw.decode().strip()
            if line == "data: [DONE]":
                done = True
                break
            if not line.startswith("data: "):
                continue
            ev = json.loads(line[6:])
            if ev.get("error"):
                return Outcome(error="error event")
            if ev.get("usage"):
                tokens = ev["usage"]["completion_tokens"]
            for ch in ev.get("choices", []):
                if ch.get("delta", {}).get("content"):
                    pieces += 1
                    if ttft is None:
                        ttft = time.time() - t0
        if not done:
            return Outcome(error="stream cut")
        end = time.time() - t0
        # A server that reports no usage: count the streamed pieces.
        return Outcome(True, ttft if ttft is not None else end, end, tokens or pieces)
    except (ConnectionResetError, BrokenPipeError, http.client.RemoteDisconnected, http.client.IncompleteRead):
        return Outcome(error="connection reset")
    except ConnectionRefusedError:
        return Outcome(error="connection refused")
    except socket.timeout:
        return Outcome(error="timeout")
    except OSError as e:
        return Outcome(error=f"os error {e.errno}")


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def burst(port, conc, per_client, max_tokens, words, timeout, base):
    """C clients, each sending `per_client` requests back to back."""
    out, lock = [], threading.Lock()

    def client(k):
        for j in range(per_client):
            o = one(port, prompt(base + k * per_client + j, words), max_tokens, timeout)
            with lock:
                out.append(o)

    t0 = time.time()
    ts = [threading.Thread(target=client, args=(k,)) for k in range(conc)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    wall = time.time() - t0
    ok = [o for o in out if o.ok]
    return {
        "concurrency": conc,
        "requests": len(out),
        "ok": len(ok),
        "errors": dict(Counter(o.error for o in out if not o.ok)),
        "ttft_mean_s": sum(o.ttft for o in ok) / len(ok) if ok else None,
        "ttft_p95_s": pct([o.ttft for o in ok], 0.95) if ok else None,
        "latency_mean_s": sum(o.latency for o in ok) / len(ok) if ok else None,
        "latency_p95_s": pct([o.latency for o in ok], 0.95) if ok else None,
        "tokens": sum(o.tokens for o in ok),
        "tokens_per_s": sum(o.tokens for o in ok) / wall,
        "wall_s": wall,
    }


def servers(a):
    ours = lambda port: [a.host, "serve", "--plugins", a.plugins, "--model", a.model, "--port", str(port)] + a.extra.split()
    ref = lambda port: [sys.executable, "-m", "mlx_lm.server", "--model", a.model, "--port", str(port)] + a.mlx_args.split()
    isolated = lambda port: ours(port) + ["--isolate"]
    table = {"ours": (ours, "/health"), "isolated": (isolated, "/health"), "mlx_lm": (ref, "/v1/models")}
    return [(n, *table[n]) for n in a.servers.split(",")]


def fmt(x, scale=1.0, spec=".2f"):
    return "-" if x is None else format(x * scale, spec)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", required=True)
    ap.add_argument("--plugins", default="plugins")
    ap.add_argument("--model", required=True)
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--per-client", type=int, default=2, help="requests each client sends back to back")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--prompt-words", type=int, default=0, help="filler words added to each prompt")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--extra", default="", help="extra flags for host serve")
    ap.add_argument("--mlx-args", default="", help="extra flags for mlx_lm.server")
    ap.add_argument("--servers", default="ours,mlx_lm")
    ap.add_argument("--json", help="also write every row as JSON here")
    ap.add_argument("--server-log", help="write each server's stderr to this path + .NAME (e.g. with RUST_LOG traces)")
    a = ap.parse_args()
    concs = [int(c) for c in a.concurrency.split(",")]
    rows = []
    for name, cmd, ready in servers(a):
        port = free_port()
        log = open(f"{a.server_log}.{name}", "w") if a.server_log else subprocess.DEVNULL
        p = subprocess.Popen(cmd(port), stdout=subprocess.DEVNULL, stderr=log)
        try:
            wait_ready(port, ready, p)
            # Warm-up: every concurrency's shapes once, outside the figures.
            burst(port, max(concs), 1, 8, a.prompt_words, a.timeout, base=10_000)
            for i, c in enumerate(concs):
                r = burst(port, c, a.per_client, a.max_tokens, a.prompt_words, a.timeout, base=i * 1000)
                r["server"] = name
                rows.append(r)
                print(f"{name} c={c}: {r['ok']}/{r['requests']} ok, {r['tokens_per_s']:.1f} tok/s, errors {r['errors']}",
                      file=sys.stderr, flush=True)
        finally:
            p.terminate()
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
    by = {(r["server"], r["concurrency"]): r for r in rows}
    names = [n for n, _, _ in servers(a)]
    print("| server | clients | ok / sent | errors | TTFT mean / p95 (ms) | latency mean / p95 (s) | aggregate tok/s |")
    print("|---|---|---|---|---|---|---|")
    for c in concs:
        for n in names:
            r = by[(n, c)]
            errs = ", ".join(f"{k} {v}" for k, v in r["errors"].items()) or "0"
            print(f"| {n} | {c} | {r['ok']} / {r['requests']} | {errs} | {fmt(r['ttft_mean_s'], 1e3, '.0f')} / "
                  f"{fmt(r['ttft_p95_s'], 1e3, '.0f')} | {fmt(r['latency_mean_s'])} / {fmt(r['latency_p95_s'])} | "
                  f"{r['tokens_per_s']:.1f} |")
    if len(names) == 2:
        print()
        print("| clients | aggregate tok/s ratio " + f"{names[0]} / {names[1]} |")
        print("|---|---|")
        for c in concs:
            x, y = by[(names[0], c)]["tokens_per_s"], by[(names[1], c)]["tokens_per_s"]
            print(f"| {c} | {x / y:.2f}x |" if y else f"| {c} | - |")
    print(f"\n({a.per_client} streaming chat requests per client, greedy, max_tokens {a.max_tokens}, "
          f"prompt filler {a.prompt_words} words; ours: `{a.extra}`; mlx_lm.server: `{a.mlx_args}`)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
