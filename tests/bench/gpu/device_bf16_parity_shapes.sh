#!/usr/bin/env bash
# H200: bf16 greedy parity with mlx-lm at real head dims (128; the tiny
# folders' 16 is below what MLX's CUDA attention kernels serve, so there
# every attention falls back to MLX's matmul formula), our default attention
# route and MLX's sdpa route (`--gpu-attention mlx`).
set -euo pipefail
source tests/bench/gpu/device_env.sh
qwen06b; family_shapes
for route in fast mlx; do
  echo "--- route: $route"
  export OURS_ARGS="--gpu-attention $route"
  bash tests/bench/gpu/device_bf16_parity.sh /tmp/m qwen3-0.6b
  bash tests/bench/gpu/device_bf16_parity.sh /tmp/f gemma3-small gemma4-small qwen3_5-small
done 2>&1 | grep -v "already exists" | tee $OUT/parity_shapes.md
