#!/usr/bin/env bash
# H200: where a batch-1 decode step of the Qwen3-8B shape goes, and what the
# fused decode projections (model-kit `gemv`, `--model-option gemv=fused`,
# the default) change against MLX's separate ops (`gemv=mlx`). Second of
# two device calls. The fused kernels alone (gemv_probe.py, 1 and 4 rows);
# `host generate` A/B (bench_variants.py: decode tok/s, same tokens or
# not); the host's step trace (graph building and launch); bf16 greedy
# parity with mlx-lm on the Qwen3-0.6B shape (MLX's sdpa route, so that
# the projections are the only difference); the kernels' own durations over
# a few decode steps from Nsight Compute (ncu_kernels.py).
set -euo pipefail
source tests/bench/gpu/device_env.sh
qwen06b
[ -d /tmp/m/qwen3-8b ] || python3 tests/bench/make_shape.py --out /tmp/m/qwen3-8b --preset qwen3-8b --tokenizer-from .device/tok > /dev/null
for m in 1; do python3 tests/bench/gpu/gemv_probe.py --rows $m || true; done | tee $OUT/gemv.md
python3 tests/bench/bench_variants.py --host $H --plugins $P --model /tmp/m/qwen3-8b --prompt-ids $IDS --gen 256 --reps 4 \
  --variant "fused=" --variant "mlx=--model-option gemv=mlx" | tee $OUT/variants.md
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
echo "## kernels of decode steps, gemv=fused"
MLX_USE_CUDA_GRAPHS=0 timeout 200 $NCU --clock-control none --metrics gpu__time_duration.sum --csv --launch-skip 12000 --launch-count 2000 \
  $G --max-tokens 60 > $OUT/ncu.csv 2> $OUT/ncu.err || { echo "ncu failed"; tail -5 $OUT/ncu.err; }
python3 tests/bench/gpu/ncu_kernels.py $OUT/ncu.csv --top 30 | tee $OUT/kernels.md
