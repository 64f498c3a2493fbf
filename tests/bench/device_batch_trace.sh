#!/usr/bin/env bash
# H200: one burst of 4 concurrent n-gram requests on the hybrid cycle folder
# with HOST_BATCH_TRACE=1 (each batched step's kind, rows, width, ms), to see
# where the batched cost rule's time goes.
set -euo pipefail
source tests/bench/device_env.sh
family_shapes
M=/tmp/f/qwen3_5-small
[ -d $M-cycle ] || { mkdir -p $M-cycle && python3 models/scripts/make_cycle.py $M $M-cycle; }
HOST_BATCH_TRACE=1 $H serve --plugins $P --model $M-cycle --port 18999 --batch 8 --draft-kind ngram "$@" 2> /tmp/trace.log > /dev/null &
pid=$!
python3 - <<'PY'
import sys, time, urllib.request
sys.path.insert(0, "tests/bench")
import bench_spec_batch as b
for _ in range(300):
    try:
        urllib.request.urlopen("http://127.0.0.1:18999/health", timeout=1).read(); break
    except Exception:
        time.sleep(0.2)
b.burst(18999, 4, 8, 3)
print("--- measured burst", flush=True)
secs, out = b.burst(18999, 4, 96, 0)
print(f"{sum(o['usage']['completion_tokens'] for o in out) / secs:.1f} tok/s", [o["usage"].get("speculation", {}).get("disabled") for o in out])
PY
kill $pid
python3 - <<'PY'
import re, collections
lines = [l for l in open("/tmp/trace.log") if l.startswith("batch ")]
tot = collections.Counter(); cnt = collections.Counter()
for l in lines:
    m = re.search(r" ms ([0-9.]+)", l)  # the "batch spec kept" lines carry no time
    if m:
        kind = l.split()[1]; tot[kind] += float(m.group(1)); cnt[kind] += 1
print({k: (cnt[k], round(tot[k], 1)) for k in cnt})
print("".join(lines[-160:]))
PY
