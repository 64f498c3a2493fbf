#!/usr/bin/env bash
# Whether separate processes decode the same greedy tokens (second of two
# device calls: .gpu_a first, then .gpu_b + .devpack running this): the
# Qwen3-8B shape (make_shape.py), a 64-token prompt (AB_SEED picks it),
# 256 tokens, RUNS processes per variant, interleaved. Variants: MLX's
# defaults, and MLX_CUDA_USE_CUDNN_SDPA=0 (a one-token query never goes to
# cuDNN: MLX's vector kernel always). Per run: decode tok/s and the first
# token where it parts from that variant's first run.
# `[RUNS=3] [AB_SEED=0] device_decode_determinism.sh`
set -euo pipefail
source tests/bench/gpu/device_env.sh
shape qwen3-8b
M=/tmp/m/qwen3-8b
IDS=$(ids ${AB_SEED:-0} 64)
{
  echo "| run | variant | decode tok/s | tokens equal the variant's first run's |"
  echo "|---|---|---|---|"
  for r in $(seq ${RUNS:-3}); do
    for variant in default no-cudnn; do
      env=(); [ $variant = no-cudnn ] && env=(MLX_CUDA_USE_CUDNN_SDPA=0)
      f=$OUT/run.$r.$variant.json
      env "${env[@]}" $H generate --plugins $P --model $M --prompt-ids $IDS --max-tokens 256 --ignore-eos --json --warmup 2>/dev/null | tail -1 > $f
      [ -f /tmp/first.$variant.json ] || cp $f /tmp/first.$variant.json
      echo "| $r | $variant | $(decode_vs $f /tmp/first.$variant.json) |"
    done
  done
} 2>&1 | tee $OUT/determinism.md
