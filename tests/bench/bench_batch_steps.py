"""Batched decode step time at B = 1, 4, 8 (a burst of equal requests, so
the rows share every step): ms per step from /stats decode_steps, and the
burst's generated tokens/s (completion tokens of all its requests / wall
time).
Usage: python3 tests/bench/bench_batch_steps.py [--host target/release/host]
    [--plugins plugins] [--model models/smollm2-135m-instruct] [--tokens 48]"""
import argparse, json, subprocess, threading, time, urllib.request

ap = argparse.ArgumentParser()
ap.add_argument("--host", default="target/release/host")
ap.add_argument("--plugins", default="plugins")
ap.add_argument("--model", default="models/smollm2-135m-instruct")
ap.add_argument("--tokens", type=int, default=48)
ap.add_argument("--port", type=int, default=18777)
a = ap.parse_args()
port = a.port
p = subprocess.Popen([a.host, "serve", "--plugins", a.plugins, "--model", a.model, "--port", str(port)],
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
def post(i, n, out):
    body = json.dumps({"prompt": f"Tell me a long story about the number {i}.", "max_tokens": n, "temperature": 0}).encode()
    r = urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body, {"Content-Type": "application/json"}))
    out.append(json.loads(r.read())["usage"]["completion_tokens"])
def stats():
    return json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/stats").read())
try:
    for _ in range(300):
        try: stats(); break
        except Exception: time.sleep(0.3)
    post(0, 4, [])
    for b in (1, 4, 8):
        s0 = stats()["decode_steps"]; t0 = time.time(); toks = []
        ts = [threading.Thread(target=post, args=(i, a.tokens, toks)) for i in range(b)]
        [t.start() for t in ts]; [t.join() for t in ts]
        dt = time.time() - t0; steps = stats()["decode_steps"] - s0
        print(f"B={b}: {steps} steps in {dt:.2f}s -> {1000*dt/max(steps,1):.1f} ms/step, {sum(toks)} tokens, {sum(toks)/dt:.1f} tok/s", flush=True)
finally:
    p.terminate()
