#!/usr/bin/env bash
# Tensor parallelism on two H200s (nvidia-h200-x2; second and later device
# calls: .gpu_a first, then .gpu_b + .devpack running this), Qwen3-8B shape
# bf16 (random weights from the shape file), `--tp 1` against `--tp 2` over
# NCCL (the default backend on a GPU runtime).
# `device_tp.sh nccl`: MLX's NCCL all_sum between two processes, alone.
# `device_tp.sh bench`: `host bench` at batch 1 and 32, 512-token prompts.
# `device_tp.sh http`: `host serve --batch 32` at 1 and 32 clients
# (bench_http.py).
set -euo pipefail
case "${1:-}" in nccl|bench|http) ;; *) echo "usage: device_tp.sh nccl|bench|http" >&2; exit 2 ;; esac
source tests/bench/gpu/device_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
S=shape:tests/bench/shapes/qwen3-8b.json
if [ "$1" = nccl ]; then
  python3 tests/bench/gpu/nccl_all_sum.py 2 | tee $OUT/tp_nccl.md
elif [ "$1" = bench ]; then
  for tp in 1 2; do
    echo "## host bench --tp $tp"
    $H bench --plugins $P --model $S --prompt-len 512 --gen-len 128 --batch 1,32 --trials 2 --tp $tp
  done 2>&1 | grep -v "^\[" | tee $OUT/tp_bench.md
else
  $H bench --plugins $P --model $S --prompt-len 8 --gen-len 2 --batch 1 --trials 1 > /dev/null   # makes the folder
  M=/tmp/mlx-engine-shapes/qwen3-8b
  bench() { python3 tests/bench/bench_http.py --host $H --plugins $P --max-tokens 128 --per-client 2 --servers ours "$@"; }
  for tp in 1 2; do
    echo "## qwen3-8b shape, --tp $tp --batch 32"
    bench --model $M --concurrency 1,32 --extra="--batch 32 --tp $tp" --json $OUT/tp_http_$tp.json
  done | tee $OUT/tp_http.md
fi
