#!/usr/bin/env bash
# 32 HTTP clients on the Qwen3-8B shape (bf16, random weights) on the H200
# (second of two device calls: .gpu_a first, then .gpu_b + .devpack running
# this): ours with the batch scheduler's step trace at 2 and at 6 chats per
# client (the first burst carries the new shapes' compile time), then ours
# against mlx_lm.server at 6 chats per client in one run.
set -euo pipefail
source tests/bench/gpu/device_env.sh
shape qwen3-8b
http() { python3 tests/bench/bench_http.py --host $H --plugins $P --model /tmp/m/qwen3-8b --max-tokens 128 --concurrency 32 --extra="--batch 32" "$@"; }
for per in 2 6; do
  echo "## ours, $per chats per client, step trace"
  RUST_LOG=host_engine::batch=trace http --per-client $per --servers ours --server-log /tmp/trace$per
  python3 tests/bench/traces.py /tmp/trace$per.ours --target host_engine::batch --event "batched plain step" --fields rows,build_ms,wait_ms,ms
  echo "steps where rows left / the other pipelined steps:"
  python3 tests/bench/traces.py /tmp/trace$per.ours --target host_engine::batch --event "batched plain step" --where "leaving>0" --fields rows,leaving,build_ms,wait_ms,ms
  python3 tests/bench/traces.py /tmp/trace$per.ours --target host_engine::batch --event "batched plain step" --where "leaving=0" --where pipelined=true --fields rows,build_ms,wait_ms,ms
  python3 tests/bench/traces.py /tmp/trace$per.ours --target host_engine::batch --by-event
done 2>&1 | tee $OUT/http_8b_trace.md
echo "## ours against mlx_lm.server, 6 chats per client"
http --per-client 6 --servers ours,mlx_lm 2>&1 | tee $OUT/http_8b.md
