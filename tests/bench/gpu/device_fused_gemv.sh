#!/usr/bin/env bash
# H200: the fused decode projections (model-kit `gemv` and `qk_norm_rope`,
# `--model-option gemv=fused`, the default) against MLX's separate ops
# (`gemv=mlx`), second of two device calls. The kernels alone at the
# Qwen3-8B layer's shapes (gemv_probe.py, 1 row); `host generate`
# A/B on the Qwen3-8B shape (bench_variants.py, 256 tokens, interleaved
# processes; the step trace is device_step_cost.sh); `host bench` at batch 1 and 4
# beside mlx_lm.benchmark at batch 1; bf16 greedy parity with mlx-lm and
# batched-vs-serial parity on the Qwen3-0.6B shape.
set -euo pipefail
source tests/bench/gpu/device_env.sh
qwen06b
shape qwen3-8b
python3 tests/bench/gpu/gemv_probe.py --rows 1 | tee $OUT/gemv.md || true
python3 tests/bench/bench_variants.py --host $H --plugins $P --model /tmp/m/qwen3-8b --prompt-ids $IDS --gen 256 --reps 3 \
  --variant "fused=" --variant "mlx=--model-option gemv=mlx" | tee $OUT/variants.md
echo "## host bench"; $H bench --plugins $P --model /tmp/m/qwen3-8b --prompt-len 512 --gen-len 128 --batch 1,4 --trials 2 | tee $OUT/bench.md
echo "## mlx_lm.benchmark -b 1"; python3 -m mlx_lm.benchmark --model /tmp/m/qwen3-8b -p 512 -g 128 -b 1 -n 2 2>&1 | grep -v Warning | tail -3 | tee -a $OUT/bench.md
OURS_ARGS="--gpu-attention mlx" bash tests/bench/gpu/device_bf16_parity.sh /tmp/m qwen3-0.6b 2>&1 | grep -v "already exists" | tee $OUT/parity.md || true
echo "batched (4 left-padded rows) vs serial: $(python3 tests/bench/batch_parity.py --host $H --plugins $P --model /tmp/m/qwen3-0.6b --clients 4 --max-tokens 64 | tail -1)" | tee -a $OUT/parity.md
