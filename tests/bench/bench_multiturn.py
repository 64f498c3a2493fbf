"""Multi-turn time to first token: each turn resends the whole conversation.
Ours with and without the prefix cache, and mlx_lm.server (whose prompt
cache is on by default), on the same model folder.

Usage: bench_multiturn.py --host BIN --plugins DIR --model DIR [--turns 4]
"""
import argparse
import json
import subprocess
import sys
import time

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench_http import free_port, wait_ready  # noqa: E402

import http.client  # noqa: E402

QUESTIONS = ["Tell me about the history of Paris.", "What about its museums?", "And its food?", "Summarise all of that.", "What should I visit first?", "Why?"]


def ask(port, msgs, max_tokens):
    body = json.dumps({"model": "default_model", "messages": msgs, "temperature": 0, "max_tokens": max_tokens, "stream": True})
    t0 = time.time()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    ttft, text = None, ""
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        for ch in json.loads(line[6:]).get("choices", []):
            piece = ch.get("delta", {}).get("content")
            if piece:
                ttft = ttft or time.time() - t0
                text += piece
    return ttft or time.time() - t0, text


def conversation(port, turns, max_tokens):
    msgs, ttfts = [], []
    for q in QUESTIONS[:turns]:
        msgs.append({"role": "user", "content": q})
        ttft, text = ask(port, msgs, max_tokens)
        ttfts.append(ttft)
        msgs.append({"role": "assistant", "content": text})
    return ttfts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", required=True)
    ap.add_argument("--plugins", default="plugins")
    ap.add_argument("--model", required=True)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    a = ap.parse_args()
    setups = {
        "ours, prefix cache": lambda p: [a.host, "serve", "--plugins", a.plugins, "--model", a.model, "--port", str(p)],
        "ours, no prefix cache": lambda p: [a.host, "serve", "--plugins", a.plugins, "--model", a.model, "--port", str(p), "--prompt-cache", "0"],
        "mlx_lm.server": lambda p: [sys.executable, "-m", "mlx_lm.server", "--model", a.model, "--port", str(p)],
    }
    rows = []
    for name, cmd in setups.items():
        port = free_port()
        proc = subprocess.Popen(cmd(port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_ready(port, "/v1/models")
            ask(port, [{"role": "user", "content": "warm up"}], 4)
            rows.append((name, conversation(port, a.turns, a.max_tokens)))
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    print("| setup | " + " | ".join(f"turn {i + 1} TTFT (ms)" for i in range(a.turns)) + " |")
    print("|---|" + "---|" * a.turns)
    for name, t in rows:
        print(f"| {name} | " + " | ".join(f"{x * 1e3:.0f}" for x in t) + " |")
    print(f"(greedy, {a.max_tokens} tokens per answer; each turn resends the whole conversation)")


if __name__ == "__main__":
    main()
