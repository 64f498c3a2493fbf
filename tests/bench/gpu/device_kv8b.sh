#!/usr/bin/env bash
# KV schemes at the Qwen3-8B shape on the H200 (second of two device calls:
# .gpu_a first, then .gpu_b + .devpack running this), random bf16 weights
# made by `host bench --model shape:...`: decode at 8k context (batch 1 and
# 16) and 32k context (batch 1) with bf16, 8-bit and 4-bit K/V.
# `device_kv8b.sh 32k16 SCHEME...`: 16 rows of 32768 tokens instead, one
# scheme per call (about 3 minutes each); the quantized rows switch to codes
# when their prefill ends (--quantized-kv-start 32768), so the prefill is
# bf16's and the decode steps read codes.
set -euo pipefail
source tests/bench/gpu/device_env.sh
S=shape:tests/bench/shapes/qwen3-8b.json
if [ "${1:-}" = 32k16 ]; then
  for q in "${@:2}"; do
    start=$([ $q = off ] || echo "--quantized-kv-start 32768")
    echo "## host bench --kv-quant $q $start, 16 rows of 32768 tokens"
    $H bench --plugins $P --model $S --prompt-len 32768 --gen-len 32 --batch 16 --trials 1 --kv-quant $q $start
  done 2>&1 | tee -a $OUT/kv8b_32k16.md
  exit 0
fi
for q in off 8 4; do
  echo "## host bench --kv-quant $q, 8192-token rows"
  $H bench --plugins $P --model $S --prompt-len 8192 --gen-len 64 --batch 1,16 --trials 1 --kv-quant $q
  echo "## host bench --kv-quant $q, 32768-token rows"
  $H bench --plugins $P --model $S --prompt-len 32768 --gen-len 64 --batch 1 --trials 1 --kv-quant $q
done 2>&1 | tee $OUT/kv8b_host.md
