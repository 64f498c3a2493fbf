#!/usr/bin/env bash
# `host bench` against mlx_lm.benchmark on the H200 (second of two device
# calls: .gpu_a first, then .gpu_b + .devpack running this), Qwen3-8B shape
# bf16 (random weights, made here): prompt 512, 128 generated, batch 1, 8
# and 32 (BATCHES narrows them), both engines on the same folder and the
# same libmlx; then, for each length in LENS (default none), prefill of a
# prompt that long and new to both engines (bench_generate.py, each warmed
# up on a longer prompt).
set -euo pipefail
source tests/bench/gpu/device_env.sh
shape qwen3-8b
M=/tmp/m/qwen3-8b
B=${BATCHES:-1,8,32}
echo "## host bench"; $H bench --plugins $P --model $M --prompt-len 512 --gen-len 128 --batch $B --trials 2 | tee $OUT/host_bench.md
for b in ${B//,/ }; do
  echo "## mlx_lm.benchmark -b $b"; python3 -m mlx_lm.benchmark --model $M -p 512 -g 128 -b $b -n 2 2>&1 | grep -v Warning | tail -4
done | tee $OUT/mlx_lm_bench.md
for L in ${LENS:-}; do
  echo "## prefill of $L new tokens"
  python3 tests/bench/bench_generate.py --host $H --plugins $P --model $M --prompt-len $L --gen 16 --reps 2 | tee $OUT/prefill_$L.md
done
