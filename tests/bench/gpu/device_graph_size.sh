#!/usr/bin/env bash
# H200: MLX's CUDA graph size (MLX_MAX_OPS_PER_BUFFER, kernels per CUDA graph
# launch; MLX 0.32's default on compute capability 9.0 is 100) for plain decoding, 5 interleaved reps; the fused
# chains off (MLX_DISABLE_COMPILE=1) once more; then ours vs mlx-lm where
# both time a prompt length new to the process (bench_generate.py).
set -euo pipefail
source tests/bench/gpu/device_env.sh
qwen06b
family_shapes
for m in /tmp/m/qwen3-0.6b /tmp/f/gemma4-small; do
  echo "## $m"; python3 tests/bench/bench_variants.py --host $H --plugins $P --gen 128 --reps 5 --model $m --prompt-ids $IDS \
    --variant "MLX default (100 per graph on compute capability 9.0)=" --variant "60 per graph=env:MLX_MAX_OPS_PER_BUFFER=60" --variant "120 per graph=env:MLX_MAX_OPS_PER_BUFFER=120" \
    --variant "not fused=env:MLX_DISABLE_COMPILE=1" | tee -a $OUT/graph_size.md
done
echo "## ours vs mlx-lm, new prompt lengths"; python3 tests/bench/bench_generate.py --host $H --plugins $P --model /tmp/m/qwen3-0.6b --model /tmp/f/gemma4-small \
  --prompt-len 512 --gen 128 --reps 2 | tee $OUT/vs.md
