"""Batched decode step time at B = 1, 4, 8 (a burst of equal requests, so
the rows share every step): ms per step from /stats decode_steps.
Usage: python3 tests/bench/bench_batch_steps.py (runs target/release/host
serve on the default model)."""
import json, subprocess, sys, threading, time, urllib.request
port = 18777
p = subprocess.Popen(["target/release/host", "serve", "--model", "models/smollm2-135m-instruct", "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
def post(i, n):
    body = json.dumps({"prompt": f"Tell me a long story about the number {i}.", "max_tokens": n, "temperature": 0, "ignore_eos": True}).encode()
    urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body, {"Content-Type": "application/json"})).read()
def stats():
    return json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/stats").read())
for _ in range(100):
    try: stats(); break
    except Exception: time.sleep(0.3)
post(0, 4)
for b in (1, 4, 8):
    s0 = stats()["decode_steps"]; t0 = time.time()
    ts = [threading.Thread(target=post, args=(i, 48)) for i in range(b)]
    [t.start() for t in ts]; [t.join() for t in ts]
    dt = time.time() - t0; steps = stats()["decode_steps"] - s0
    print(f"B={b}: {steps} steps in {dt:.2f}s -> {1000*dt/max(steps,1):.1f} ms/step, {b*48/dt:.1f} tok/s")
p.terminate()
