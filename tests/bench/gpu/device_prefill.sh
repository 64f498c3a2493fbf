#!/usr/bin/env bash
# H200: prefill of prompt lengths new to the process (host generate --warmup
# warms up on a longer prompt), with the unfused short-query attention
# limited to 16 query tokens (longer prompts go to MLX's sdpa, i.e. cuDNN)
# vs 2048 (the default): `--model-option attention-unfused-max=N`; 3 runs each.
# `device_prefill.sh qwen3-8b` runs the Qwen3-8B shape instead of the 0.6B one;
# LENS (prompt lengths) and REPS (runs each) narrow it.
set -euo pipefail
source tests/bench/gpu/device_env.sh
SHAPE=${1:-qwen3-0.6b}
shape $SHAPE
echo "| prompt tokens | unfused up to | prefill tok/s, ${REPS:-3} runs |"
echo "|---|---|---|"
for L in ${LENS:-100 500 1000 2000 4000}; do
  IDS=$(ids $L $L)
  for lim in 16 2048; do
    rs=""
    for rep in $(seq ${REPS:-3}); do
      rs="$rs $($H generate --plugins $P --model /tmp/m/$SHAPE --prompt-ids $IDS --max-tokens 2 --ignore-eos --json --warmup \
        --model-option attention-unfused-max=$lim | python3 -c "import json,sys; print(round(json.load(sys.stdin)['prefill_tokens_per_s']))")"
    done
    echo "| $L | $lim |$rs |"
  done
done | tee $OUT/prefill_$SHAPE.md
