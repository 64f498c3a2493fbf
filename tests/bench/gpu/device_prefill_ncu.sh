#!/usr/bin/env bash
# H200: where a new prompt's prefill spends device time, ours against
# mlx-lm's, kernel by kernel (Nsight Compute's duration of every launch,
# summed by kernel name and grid with ncu_kernels.py). One prefill of
# L tokens (default 4096) at the Qwen3-8B shape in each engine, one
# generated token, no warm-up (ncu times kernels, not compiles). Second of
# two device calls (.gpu_b + .devpack). `device_prefill_ncu.sh 4096 qwen3-8b`.
set -euo pipefail
source tests/bench/gpu/device_env.sh
L=${1:-4096}; SHAPE=${2:-qwen3-8b}
shape $SHAPE
IDS=$(ids $L $L)
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
export MLX_USE_CUDA_GRAPHS=0
timeout 280 $NCU --clock-control none --metrics gpu__time_duration.sum --csv \
  $H generate --plugins $P --model /tmp/m/$SHAPE --prompt-ids $IDS --max-tokens 1 --ignore-eos --json \
  > $OUT/ncu_prefill_ours.csv 2> $OUT/ncu_ours.err || { echo "ncu (ours) failed"; tail -5 $OUT/ncu_ours.err; }
timeout 280 $NCU --clock-control none --metrics gpu__time_duration.sum --csv \
  python3 -c "
import random, sys
import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import generate_step
m, _ = load('/tmp/m/$SHAPE')
r = random.Random($L); ids = [r.randrange(100, 49000) for _ in range($L)]
for _ in generate_step(mx.array(ids), m, max_tokens=1): pass
" > $OUT/ncu_prefill_mlxlm.csv 2> $OUT/ncu_mlxlm.err || { echo "ncu (mlx-lm) failed"; tail -5 $OUT/ncu_mlxlm.err; }
for side in ours mlxlm; do
  echo "## $side, prefill of $L tokens, $SHAPE"
  python3 tests/bench/gpu/ncu_kernels.py $OUT/ncu_prefill_$side.csv --split-at gather --top 25
done | tee $OUT/prefill_ncu.md
