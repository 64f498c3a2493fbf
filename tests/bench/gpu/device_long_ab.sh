#!/usr/bin/env bash
# H200: decode at long context, this build against another (its pack at
# .devpack_b/device.tar.xz): `host bench` on the Qwen3-8B shape (random
# bf16 weights, made in process), one row after 8192 and 32768 prompt
# tokens and 16 rows of 8192, 64 tokens generated, the builds alternated.
# Second of two device calls (.gpu_b + .devpack + .devpack_b).
set -euo pipefail
source tests/bench/gpu/device_env.sh
other_build
S=shape:tests/bench/shapes/qwen3-8b.json
{
  for case in "8192 1" "8192 16" "32768 1"; do
    read -r len batch <<< "$case"
    for side in other this; do
      side_build $side
      echo "## $side build: $len-token rows, batch $batch"
      $BIN bench --plugins $PL --model $S --prompt-len $len --gen-len 64 --batch $batch --trials 1 | tail -1
    done
  done
} 2>&1 | tee $OUT/long_ab.md
