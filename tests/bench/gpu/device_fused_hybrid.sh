#!/usr/bin/env bash
# H200: the hybrid family with its compiled gated-delta step against
# MLX_DISABLE_COMPILE=1, then against mlx-lm at new prompt lengths; and
# two-model speculation on the agreeing pair now that the verify's SwiGLU is
# one kernel per layer.
set -euo pipefail
source tests/bench/gpu/device_env.sh
family_shapes
echo "## qwen3_5-small"; python3 tests/bench/bench_variants.py --host $H --plugins $P --gen 128 --reps 4 --model /tmp/f/qwen3_5-small --prompt-ids $IDS \
  --variant "fused=" --variant "not fused=env:MLX_DISABLE_COMPILE=1" | tee $OUT/hybrid.md
echo "## vs mlx-lm"; python3 tests/bench/bench_generate.py --host $H --plugins $P --model /tmp/f/qwen3_5-small --prompt-len 512 --gen 128 --reps 2 | tee $OUT/vs.md
pair 0.02
D="--draft-model /tmp/m/pair-0.02/draft --num-draft-tokens 3"
echo "## two-model, agreeing pair"; python3 tests/bench/bench_variants.py --host $H --plugins $P --gen 128 --reps 4 --model /tmp/m/pair-0.02/target --prompt-ids $IDS \
  --variant "plain=" --variant "two-model k3 always=$D --speculate-always" --variant "two-model k3 judged=$D" \
  --variant "two-model k3 always, not fused=env:MLX_DISABLE_COMPILE=1 $D --speculate-always" | tee $OUT/pair.md
