#!/usr/bin/env bash
# The K/V codes read in place on the H200 (second of two device calls:
# .gpu_a first, then .gpu_b + .devpack running this). First how far 8- and
# 4-bit codes move next-token distributions from bf16 K/V (`host kv-kl`,
# Qwen3-0.6B shape, 512 tokens of the README): one token per forward
# (`--chunk 1`: decode steps, read by the codes kernel) against 64 per
# forward (the dequantized route); the two must agree. Then the speed at
# the Qwen3-8B shape (device_kv8b.sh).
set -euo pipefail
source tests/bench/gpu/device_env.sh
qwen06b
for q in 8 4; do
  for chunk in 1 64; do
    echo "## kv-kl --kv-quant $q --chunk $chunk"
    $H kv-kl --plugins $P --model /tmp/m/qwen3-0.6b --text-file README.md --tokens 512 --chunk $chunk --kv-quant $q \
      | python3 -c "import json,sys; r=json.load(sys.stdin); print({k: v for k, v in r.items() if not isinstance(v, list)})"
  done
done 2>&1 | tee $OUT/kvcodes_kl.md
bash tests/bench/gpu/device_kv8b.sh
