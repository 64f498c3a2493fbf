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
# and each plugin folder in $PLUGINS (default $H and $P: A/Bs in one lease),
# with K/V schemes $QS (default "off 8").
set -euo pipefail
source tests/bench/gpu/device_env.sh
shape qwen3-8b
HOSTS=${HOSTS:-$H}
PLUGINS=${PLUGINS:-$P}
case ${1:-bench} in
probe)
  for v in rows "rows --clear" "rows --cache-limit 6.5" parts bf16 "bf16 --clear" "bf16 --cache-limit 6.5"; do
    python3 tests/bench/gpu/kv_rows_alloc_probe.py $v
  done 2>&1 | tee $OUT/kvq_probe.md ;;
bench)
  for q in ${QS:-off 8}; do
    for h in $HOSTS; do for p in $PLUGINS; do
      echo "## $h --plugins $p bench --kv-quant $q"
      RUST_LOG=host_engine::batch=trace $h bench --plugins $p --model /tmp/m/qwen3-8b --prompt-len 8192 --gen-len 32 \
        --batch 16 --trials 1 --kv-quant $q 2> $OUT/kvq_trace_$(basename $h)_$(basename $p)_$q.log
    done; done
  done 2>&1 | tee $OUT/kvq_bench.md ;;
http)
  for q in ${QS:-off 8}; do
    for h in $HOSTS; do for p in $PLUGINS; do
      echo "## $h --plugins $p serve --kv-quant $q"
      python3 tests/bench/bench_http.py --host $h --plugins $p --model /tmp/m/qwen3-8b --servers ours --concurrency 16 \
        --per-client 1 --max-tokens 32 --prompt-words 4000 --extra="--batch 16 --kv-quant $q" | tail -3
    done; done
  done 2>&1 | tee $OUT/kvq_http.md ;;
esac
