"""Memory under load: N streaming chat clients in a loop against `host serve`,
sampling the server's resident memory and what it reports about MLX and the
prefix cache.

Usage:
  soak_memory.py --host target/release/host --model DIR [--clients 64]
      [--seconds 300] [--max-tokens 16] [--every 10] [--json OUT]
      [-- extra host serve arguments]

Each client sends short chats (temperature 0.7, `--max-tokens` tokens) with
prompts drawn from a fixed word list by a seeded generator, so prompts share
prefixes (the chat template) and differ after it, as real traffic does. Every
`--every` seconds it prints one row: elapsed seconds, requests done, the
server's RSS (VmRSS of the process), MLX active / cache / peak bytes and the
prefix cache's counted bytes and entries (both from /stats). At the end it
prints the growth of RSS after the warm-up row (the second) and the gap
between MLX's active bytes and weights + prefix-cache bytes once the load has
stopped (nothing else should be live then), and what /stats says is left
then (queued and running requests, reserved K/V: all 0).
"""
import argparse
import http.client
import json
import random
import socket
import subprocess
import sys
import threading
import time

WORDS = ("apple river stone cloud music paper window garden silver engine forest candle winter market "
         "question number planet bridge letter mountain ocean pencil shadow spring summer thunder velvet").split()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def get_json(port, path):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", path)
    return json.loads(c.getresponse().read())


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def client(port, seed, max_tokens, stop_at, done, errors):
    rng = random.Random(seed)
    while time.time() < stop_at:
        prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 24)))
        body = json.dumps({"messages": [{"role": "user", "content": prompt}], "temperature": 0.7, "max_tokens": max_tokens,
                           "stream": True})
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
            c.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
            r = c.getresponse()
            data = r.read()
            if r.status != 200 or b"[DONE]" not in data:
                errors.append(f"{r.status}: {data[:200]!r}")
            else:
                done.append(1)
        except OSError as e:
            errors.append(str(e))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="target/release/host")
    ap.add_argument("--model", required=True)
    ap.add_argument("--plugins", default="plugins")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=300)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--every", type=float, default=10)
    ap.add_argument("--json")
    ap.add_argument("--server-log", help="the server's stderr goes here (with RUST_LOG set: its traces)")
    ap.add_argument("extra", nargs="*")
    a = ap.parse_args()

    port = free_port()
    server = subprocess.Popen([a.host, "serve", "--plugins", a.plugins, "--model", a.model, "--port", str(port),
                               "--queue", str(a.clients * 2), *a.extra], stdout=subprocess.DEVNULL,
                              stderr=open(a.server_log, "w") if a.server_log else subprocess.DEVNULL)
    try:
        t0 = time.time()
        while True:
            try:
                get_json(port, "/health")
                break
            except OSError:
                if time.time() - t0 > 300 or server.poll() is not None:
                    sys.exit("server did not start")
                time.sleep(0.3)
        start = time.time()
        stop_at = start + a.seconds
        done, errors = [], []
        threads = [threading.Thread(target=client, args=(port, i, a.max_tokens, stop_at, done, errors), daemon=True)
                   for i in range(a.clients)]
        for t in threads:
            t.start()
        rows = []
        print(f"{'s':>6} {'requests':>8} {'rss GB':>8} {'active GB':>9} {'cache GB':>8} {'peak GB':>8} {'prefix GB':>9} {'entries':>7}")

        def sample():
            s = get_json(port, "/stats")
            m = s.get("mlx_memory", {})
            row = {"s": round(time.time() - start, 1), "requests": len(done), "errors": len(errors), "rss": rss_bytes(server.pid),
                   "active": m.get("active_bytes", 0), "cache": m.get("cache_bytes", 0), "peak": m.get("peak_bytes", 0),
                   "weights": m.get("weights_bytes", 0), "prefix": s.get("prefix_cache_bytes", 0),
                   "entries": s.get("prefix_cache_entries", 0), "active_rows": s.get("active", 0)}
            rows.append(row)
            print(f"{row['s']:>6} {row['requests']:>8} {row['rss'] / 1e9:>8.2f} {row['active'] / 1e9:>9.3f} {row['cache'] / 1e9:>8.3f} "
                  f"{row['peak'] / 1e9:>8.3f} {row['prefix'] / 1e9:>9.3f} {row['entries']:>7}", flush=True)
            return row

        while time.time() < stop_at:
            time.sleep(min(a.every, max(0.0, stop_at - time.time())))
            sample()
        for t in threads:
            t.join()
        # Idle: only the weights and the prefix cache's entries should be live.
        # (engine_idle: rows answered, their device work run out, buffers returned.)
        while (st := get_json(port, "/stats")).get("active", 0) > 0 or st.get("engine_idle") is not True:
            time.sleep(0.2)
        idle = sample()
        left = {k: st.get(k) for k in ("queued", "active", "kv_reserved_bytes")}
        warm = rows[1] if len(rows) > 2 else rows[0]
        growth = max(r["rss"] for r in rows) - warm["rss"]
        gap = idle["active"] - idle["weights"] - idle["prefix"]
        summary = {"clients": a.clients, "seconds": a.seconds, "requests": len(done), "errors": len(errors),
                   "rss_after_warmup": warm["rss"], "rss_growth_after_warmup": growth,
                   "idle_active_minus_weights_minus_prefix": gap, "left_when_idle": left, "rows": rows,
                   "first_errors": errors[:5]}
        print(f"requests {len(done)} ({len(done) / a.seconds * 60:.0f}/min), errors {len(errors)}; "
              f"RSS growth after warm-up {growth / 1e9:.2f} GB; idle MLX active - weights - prefix cache = {gap / 1e6:.1f} MB; "
              f"left when idle {left}")
        if errors:
            print("first errors:", *errors[:5], sep="\n  ")
        if a.json:
            with open(a.json, "w") as f:
                json.dump(summary, f, indent=1)
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
