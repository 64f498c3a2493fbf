#!/usr/bin/env bash
# KV schemes at the Qwen3-8B shape on the H200 (second of two device calls:
# .gpu_a first, then .gpu_b + .devpack running this), random bf16 weights
# made by `host bench --model shape:...`: decode at 8k context (batch 1 and
# 16) and 32k context (batch 1) with bf16, 8-bit and 4-bit K/V.
set -euo pipefail
source tests/bench/gpu/device_env.sh
S=shape:tests/bench/shapes/qwen3-8b.json
for q in off 8 4; do
  echo "## host bench --kv-quant $q, 8192-token rows"
  $H bench --plugins $P --model $S --prompt-len 8192 --gen-len 64 --batch 1,16 --trials 1 --kv-quant $q
  echo "## host bench --kv-quant $q, 32768-token rows"
  $H bench --plugins $P --model $S --prompt-len 32768 --gen-len 64 --batch 1 --trials 1 --kv-quant $q
done 2>&1 | tee $OUT/kv8b_host.md
