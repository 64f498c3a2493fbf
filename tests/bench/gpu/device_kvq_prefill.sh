#!/usr/bin/env bash
# H200: prefill over quantized K/V at 16 rows (docs/benchmarks.md, "Prefill
# over quantized K/V"), Qwen3-8B shape.
#   device_kvq_prefill.sh probe   MLX alone (kv_rows_alloc_probe.py): the
#                                 buffer cache kept, emptied between chunks,
#                                 or bounded as `host serve` bounds it
#   device_kvq_prefill.sh bench   `host bench` at 16 rows of 8192 tokens with
#                                 bf16 and 8-bit K/V, for each host binary in
#                                 $HOSTS (default $H: an A/B in one lease)
#   device_kvq_prefill.sh http    the server: 16 clients at once, each with a
#                                 prompt of about 8k tokens (bench_http.py),
#                                 for each host binary in $HOSTS
set -euo pipefail
source tests/bench/gpu/device_env.sh
shape qwen3-8b
HOSTS=${HOSTS:-$H}
case ${1:-bench} in
probe)
  for v in rows "rows --clear" "rows --cache-limit 6.5" parts bf16 "bf16 --clear" "bf16 --cache-limit 6.5"; do
    python3 tests/bench/gpu/kv_rows_alloc_probe.py $v
  done 2>&1 | tee $OUT/kvq_probe.md ;;
bench)
  for q in off 8; do
    for h in $HOSTS; do
      echo "## $h bench --kv-quant $q"
      RUST_LOG=host_engine::batch=trace $h bench --plugins $P --model /tmp/m/qwen3-8b --prompt-len 8192 --gen-len 32 \
        --batch 16 --trials 1 --kv-quant $q 2> $OUT/kvq_trace_$(basename $h)_$q.log
    done
  done 2>&1 | tee $OUT/kvq_bench.md ;;
http)
  for q in off 8; do
    for h in $HOSTS; do
      echo "## $h serve --kv-quant $q"
      python3 tests/bench/bench_http.py --host $h --plugins $P --model /tmp/m/qwen3-8b --servers ours --concurrency 16 \
        --per-client 1 --max-tokens 32 --prompt-words 4000 --extra="--batch 16 --kv-quant $q" | tail -3
    done
  done 2>&1 | tee $OUT/kvq_http.md ;;
esac
