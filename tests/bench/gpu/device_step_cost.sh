#!/usr/bin/env bash
# H200: where a batch-1 decode step of the Qwen3-8B shape goes, on both
# routes of the decode projections (model-kit `gemv`: `--model-option
# gemv=fused`, the default, and `gemv=mlx`, MLX's separate ops). Second of
# two device calls. The host's step trace (graph building and launch); bf16
# greedy parity with mlx-lm on the Qwen3-0.6B shape (MLX's sdpa route, so
# that the projections are the only difference); the kernels' own durations
# over a few decode steps from Nsight Compute (ncu_kernels.py). The A/B of
# decode rates is device_fused_gemv.sh.
set -euo pipefail
source tests/bench/gpu/device_env.sh
qwen06b
shape qwen3-8b
G="$H generate --plugins $P --model /tmp/m/qwen3-8b --prompt-ids $IDS --ignore-eos --json"
for v in fused mlx; do
  echo "## step trace, gemv=$v (median of the last 100 steps)"
  RUST_LOG=host_engine::step=trace $G --max-tokens 256 --warmup --model-option gemv=$v 2> $OUT/trace.txt > /dev/null
  python3 tests/bench/traces.py $OUT/trace.txt --target host_engine::step --event "plain step" --last 100 --fields graph_ms,launch_ms
done | tee $OUT/launch.md
for v in fused mlx; do
  echo "## parity with mlx-lm, gemv=$v"
  OURS_ARGS="--gpu-attention mlx --model-option gemv=$v" bash tests/bench/gpu/device_bf16_parity.sh /tmp/m qwen3-0.6b || true
done 2>&1 | grep -v "already exists" | tee $OUT/parity.md
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
for v in fused mlx; do
  echo "## kernels of decode steps, gemv=$v"
  MLX_USE_CUDA_GRAPHS=0 timeout 200 $NCU --clock-control none --metrics gpu__time_duration.sum --csv --launch-skip 12000 --launch-count 2000 \
    $G --max-tokens 60 --model-option gemv=$v > $OUT/ncu-$v.csv 2> $OUT/ncu.err || { echo "ncu failed"; tail -5 $OUT/ncu.err; }
  python3 tests/bench/gpu/ncu_kernels.py $OUT/ncu-$v.csv --top 30
done | tee $OUT/kernels.md
