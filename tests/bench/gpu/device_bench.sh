#!/usr/bin/env bash
# `host bench` against mlx_lm.benchmark on the H200 (second of two device
# calls: .gpu_a first, then .gpu_b + .devpack running this), Qwen3-8B shape
# bf16 (random weights, made here): prompt 512, 128 generated, batch 1, 8
# and 32, both engines on the same folder and the same libmlx.
set -euo pipefail
source tests/bench/gpu/device_env.sh
[ -d /tmp/m/qwen3-8b ] || python3 tests/bench/make_shape.py --out /tmp/m/qwen3-8b --preset qwen3-8b --tokenizer-from .device/tok
echo "## host bench"; $H bench --plugins $P --model /tmp/m/qwen3-8b --prompt-len 512 --gen-len 128 --batch 1,8,32 --trials 2 | tee $OUT/host_bench.md
for b in 1 8 32; do
  echo "## mlx_lm.benchmark -b $b"; python3 -m mlx_lm.benchmark --model /tmp/m/qwen3-8b -p 512 -g 128 -b $b -n 2 2>&1 | grep -v Warning | tail -4
done | tee $OUT/mlx_lm_bench.md
