#!/usr/bin/env bash
# The server comparison on the H200 (second of two device calls: .gpu_a
# first, then .gpu_b + .devpack running this): bench_http.py, `host serve`
# against mlx_lm.server on the same random-weight folders in one run.
# `device_http.sh small`: the Qwen3-0.6B shape at 1/8/32/64 clients;
# `device_http.sh 8b`: the Qwen3-8B shape at 1 and 32 clients.
# Both servers batch up to 64 rows (mlx_lm.server's --decode-concurrency).
# `device_http.sh isolation`: the cost of `--isolate`, ours with and without
# it on the 0.6B shape at 1 and 8 clients, in both orders.
set -euo pipefail
case "${1:-}" in small|8b|isolation) ;; *) echo "usage: device_http.sh small|8b|isolation" >&2; exit 2 ;; esac
source tests/bench/gpu/device_env.sh
bench() { python3 tests/bench/bench_http.py --host $H --plugins $P --max-tokens 128 --per-client 2 "$@"; }
if [ "$1" = isolation ]; then
  qwen06b
  for order in ours,isolated isolated,ours; do
    echo "## qwen3-0.6b shape, $order"; bench --model /tmp/m/qwen3-0.6b --concurrency 1,8 --per-client 6 \
      --servers $order --extra="--batch 8" | tee -a $OUT/http_isolation.md
  done
elif [ "$1" = small ]; then
  qwen06b
  echo "## qwen3-0.6b shape"; bench --model /tmp/m/qwen3-0.6b --concurrency 1,8,32,64 \
    --extra="--batch 64" --mlx-args="--decode-concurrency 64" --json $OUT/http_small.json | tee $OUT/http_small.md
else
  shape qwen3-8b
  echo "## qwen3-8b shape"; bench --model /tmp/m/qwen3-8b --concurrency 1,32 \
    --extra="--batch 32" --mlx-args="--decode-concurrency 32" --json $OUT/http_8b.json | tee $OUT/http_8b.md
fi
