"""One request at a time through one `host serve`, its decode steps timed
by the server's step trace: how much of one stream's pace the request's
own shape decides (streamed or not, read by a raw socket, a prefix-cache
hit or miss) against what varies from one request to the next.

    one_stream_steps.py --host H --plugins P --model DIR [--modes plain,stream,raw] [--repeats 3]
                        [--max-tokens 256] [--taskset CORES] [--extra "..."]

Modes: `plain` (one JSON answer), `stream` (SSE read by http.client),
`raw` (SSE read off a bare socket), `hit` (the same prompt as the warm-up
request: its prefix is cached), `miss` (a prompt not seen before). The
modes run interleaved, `--repeats` times, after one warm-up request.
Prints per request the median step time, and of it the host's build time
(`build_ms`: building and queueing graphs) from the trace.
"""
import argparse
import http.client
import json
import os
import re
import socket
import statistics
import subprocess
import tempfile
import time

from bench_http import free_port, wait_ready

ap = argparse.ArgumentParser()
ap.add_argument("--host", required=True)
ap.add_argument("--plugins", required=True)
ap.add_argument("--model", required=True)
ap.add_argument("--modes", default="plain,stream,raw")
ap.add_argument("--repeats", type=int, default=3)
ap.add_argument("--max-tokens", type=int, default=256)
ap.add_argument("--taskset", default="", help="run the server under `taskset -c CORES`")
ap.add_argument("--extra", default="", help="more `host serve` arguments")
a = ap.parse_args()

WARM = "Tell me a story about cats."
log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
port = free_port()
cmd = [a.host, "serve", "--plugins", a.plugins, "--model", a.model, "--port", str(port), *a.extra.split()]
if a.taskset:
    cmd = ["taskset", "-c", a.taskset, *cmd]
server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log,
                          env=dict(os.environ, RUST_LOG="host_engine::batch=trace"))


def steps():
    with open(log.name) as f:
        return [line for line in f if "batched plain step" in line]


def field(line, key):
    return float(re.search(key + r"=([\d.]+)", line).group(1))


def request(mode, n):
    prompt = f"Tell me a story about dogs, number {n}." if mode == "miss" else WARM
    body = {"messages": [{"role": "user", "content": prompt}], "temperature": 0, "max_tokens": a.max_tokens,
            "stream": mode in ("stream", "raw")}
    if mode == "raw":
        s = socket.create_connection(("127.0.0.1", port))
        data = json.dumps(body).encode()
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(data) + data)
        got = b""
        while not got.endswith(b"0\r\n\r\n"):
            chunk = s.recv(1 << 20)
            if not chunk:
                break
            got += chunk
        s.close()
        return
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    while r.read1(65536):
        pass


def timed(mode, n):
    before = len(steps())
    t = time.time()
    request(mode, n)
    wall = time.time() - t
    # The trace line of the last step is written as its tokens are handed out.
    time.sleep(0.2)
    seg = steps()[before:]
    med = lambda key: statistics.median(field(line, key) for line in seg) if seg else float("nan")
    print(f"{mode:6s} wall {wall:6.3f} s  steps {len(seg):4d}  median step {med(' ms'):6.3f} ms"
          f"  build {med('build_ms'):6.3f} ms", flush=True)


try:
    wait_ready(port, "/health", server)
    timed("warm-up", 0)
    for n in range(a.repeats):
        for mode in a.modes.split(","):
            timed(mode, n)
finally:
    server.terminate()
    server.wait()
