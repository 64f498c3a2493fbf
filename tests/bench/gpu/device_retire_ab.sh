#!/usr/bin/env bash
# H200: 32 HTTP clients on the Qwen3-8B shape (128-token chats, `--batch 32`,
# 6 chats per client, the step trace), this build against another (its
# pack at .devpack_b/device.tar.xz), alternating servers, ROUNDS rounds:
# aggregate tok/s, and the median step where rows left against the other
# pipelined steps (what retiring finished rows costs). Second of two device
# calls (.gpu_b + .devpack + .devpack_b). `device_retire_ab.sh [ROUNDS]`
set -uo pipefail
source tests/bench/gpu/device_env.sh
shape qwen3-8b
other_build
for r in $(seq ${1:-2}); do
  for side in other this; do
    side_build $side
    log=/tmp/retire_${side}_$r
    echo "## round $r, $side build"
    RUST_LOG=host_engine::batch=trace python3 tests/bench/bench_http.py --host $BIN --plugins $PL --model /tmp/m/qwen3-8b \
      --max-tokens 128 --concurrency 32 --extra="--batch 32" --per-client 6 --servers ours --server-log $log 2>&1 | grep -E "ours c=|Traceback|Error"
    echo -n "rows left: "
    python3 tests/bench/traces.py $log.ours --target host_engine::batch --event "batched plain step" --where "leaving>0" --fields rows,leaving,build_ms,wait_ms,ms
    echo -n "other pipelined steps: "
    python3 tests/bench/traces.py $log.ours --target host_engine::batch --event "batched plain step" --where "leaving=0" --where pipelined=true --fields rows,build_ms,wait_ms,ms
  done
done 2>&1 | tee $OUT/retire_ab.md
