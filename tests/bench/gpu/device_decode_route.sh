#!/usr/bin/env bash
# H200: batch-1 decode with 1-token attention through cuDNN (MLX's choice
# for a slice of a 256-multiple-wide K/V cache: a plan per new width) or
# MLX's vector kernel (`MLX_CUDA_USE_CUDNN_SDPA=0`, which also keeps
# prefill off cuDNN, so the prompt is short enough for our unfused route),
# interleaved processes (`bench_variants.py`); then where a 4096-token
# prefill of this build spends its time (device_prefill_timeline.sh).
# Second of two device calls (.gpu_b + .devpack). `device_decode_route.sh`
set -euo pipefail
source tests/bench/gpu/device_env.sh
shape qwen3-8b
I512=$(ids 5 512)
python3 tests/bench/bench_variants.py --host $H --plugins $P --model /tmp/m/qwen3-8b --prompt-ids $I512 --gen 256 --reps 3 \
  --variant "cudnn=" --variant "vector=env:MLX_CUDA_USE_CUDNN_SDPA=0" | tee $OUT/decode_route.md
bash tests/bench/gpu/device_prefill_timeline.sh qwen3-8b ours:4096 mlxlm:4096
