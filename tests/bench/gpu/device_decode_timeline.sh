#!/usr/bin/env bash
# H200: where a plain batch-1 decode step goes at the Qwen3-8B shape (bf16,
# random weights): `host bench` at batch 1 for the rate, then the CUDA
# timeline of 128 greedy steps (cupti_trace.c, read by timeline.py): per
# step the wall time, the GPU's busy time, the kernel count, the host API
# calls and the kernels taking most GPU time, over the last 40 steps.
# Second of two device calls (.gpu_b + .devpack).
set -euo pipefail
source tests/bench/gpu/device_env.sh
shape qwen3-8b
source tests/bench/gpu/build_cupti_trace.sh
export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$CUPTI_LIB"
IDS=$(ids 64 64)
{
  nvidia-smi --query-gpu=name --format=csv,noheader
  echo "## host bench, batch 1"
  $H bench --plugins $P --model /tmp/m/qwen3-8b --prompt-len 512 --gen-len 128 --batch 1 --trials 2
  echo "## plain decode, the last 40 steps"
  RUST_LOG=host_engine::step=trace trace plain $H generate --plugins $P --model /tmp/m/qwen3-8b --prompt-ids $IDS \
    --max-tokens 128 --ignore-eos --json --warmup > $OUT/plain.json 2> $OUT/plain.log
  python3 tests/bench/gpu/timeline.py $OUT/plain.csv --rust-log $OUT/plain.log --last 40 --top-api 8 --kernels 30 | tail -60
  rm -f $OUT/plain.csv
} 2>&1 | tee $OUT/decode_timeline.md
