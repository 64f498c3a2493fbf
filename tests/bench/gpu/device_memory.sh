#!/usr/bin/env bash
# Memory under load on the H200 (second of two device calls: .gpu_a first,
# then .gpu_b + .devpack running this): 64 streaming clients for 60 s on the
# Qwen3-0.6B shape (bf16, random weights), prefix cache on (the default)
# and off, each printing MLX's active/cache bytes and the prefix cache's
# counted bytes every 10 s (tests/bench/soak_memory.py).
set -euo pipefail
source tests/bench/gpu/device_env.sh
qwen06b
for extra in "" "--prompt-cache 0"; do
  echo "## 64 clients x 60 s, host serve ${extra:-(defaults)}"
  python3 tests/bench/soak_memory.py --host $H --plugins $P --model /tmp/m/qwen3-0.6b --clients 64 --seconds 60 --every 10 -- $extra
done 2>&1 | tee $OUT/memory.md
