"""Memory of ROWS batched rows that share a long system prompt, plain K/V
against `--paged-kv` (docs/benchmarks.md, "Paged K/V").

A first request leaves the system prompt in the prefix cache; ROWS requests
(the system prompt and a few tokens of their own each) are queued while the
engine is held, then released for ROWS decode steps: one joiner merges per
iteration, so every row is in and none has finished. /stats is read there:
MLX's active bytes beside the weights, and the block pool's counts. The
server is then stopped (the rows' answers are tests/it kv_paged's concern).

python3 tests/bench/bench_paged_memory.py --host target/release/host \\
    --model models/smollm2-135m-instruct --system 2048 --rows 32
"""
import argparse
import json
import socket
import threading
import time
import urllib.request

from host_server import start


def call(port, method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method,
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=3600) as r:
        return json.loads(r.read() or b"null")


def wait(port, ready):
    while True:
        st = call(port, "GET", "/stats")
        if ready(st):
            return st
        time.sleep(0.05)


def run(args, extra):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [args.host, "serve", "--model", args.model, "--port", str(port), "--batch", str(args.rows),
           "--debug-endpoints", "--prompt-cache", str(args.prompt_cache)] + extra
    p = start(cmd, port)
    try:
        system = [(i * 7919) % 20000 + 10 for i in range(args.system)]
        body = lambda i: {"prompt": system + [30000 + i, 30100, 30200 + i], "max_tokens": args.rows + 2,
                          "temperature": 0}
        call(port, "POST", "/v1/completions", body(1000))
        call(port, "POST", "/debug/hold", None)
        def go(i):
            try:
                call(port, "POST", "/v1/completions", body(i))
            except Exception:
                pass  # the server is stopped once measured

        ts = [threading.Thread(target=go, args=(i,), daemon=True) for i in range(args.rows)]
        for t in ts:
            t.start()
        wait(port, lambda st: st["queued"] == args.rows)
        call(port, "POST", f"/debug/release?steps={args.rows}", None)
        st = wait(port, lambda st: st["hold"]["parked"] and st["hold"]["held"] and st["queued"] == 0)
        m = st["mlx_memory"]
        return {
            "flags": " ".join(extra) or "(plain)",
            "active_rows": st["active"],
            "active_beside_weights_mib": (m["active_bytes"] - m["weights_bytes"]) / 2**20,
            "prefix_cache_mib": st["prefix_cache_bytes"] / 2**20,
            "kv_pool": st.get("kv_pool"),
        }
    finally:
        p.terminate()
        p.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="target/release/host")
    ap.add_argument("--model", default="models/smollm2-135m-instruct")
    ap.add_argument("--system", type=int, default=2048)
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--prompt-cache", type=float, default=0.25)
    args = ap.parse_args()
    plain = run(args, [])
    paged = run(args, ["--paged-kv"])
    print(json.dumps({"plain": plain, "paged": paged}, indent=1))


if __name__ == "__main__":
    main()
