#!/usr/bin/env bash
# H200: one burst of 4 concurrent n-gram requests on the hybrid cycle folder
# with the batched steps' trace events (target host_engine::batch: each
# step's rows, width, ms, cost and drafts, then what each row kept), to see
# where the batched cost rule's time goes.
set -euo pipefail
source tests/bench/gpu/device_env.sh
family_shapes
M=/tmp/f/qwen3_5-small
[ -d $M-cycle ] || { mkdir -p $M-cycle && python3 models/scripts/make_cycle.py $M $M-cycle; }
RUST_LOG=host_engine=trace $H serve --plugins $P --model $M-cycle --port 18999 --batch 8 --draft-kind ngram "$@" 2> /tmp/trace.log > /dev/null &
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
print(f"{sum(o['usage']['completion_tokens'] for o in out) / secs:.1f} tok/s", [(o["usage"].get("speculation") or {}).get("disabled") for o in out])
PY
kill $pid
cp /tmp/trace.log $OUT/batch_trace.log
python3 tests/bench/traces.py /tmp/trace.log --target host_engine::batch --by-event
grep "host_engine::batch" /tmp/trace.log | tail -160
