#!/usr/bin/env bash
# H200: the hybrid's depthwise conv as one fused kernel (the default) against
# MLX's conv1d (`--model-option conv=mlx`; cuDNN: a graph build per new input
# shape), at new prompt lengths and in batched n-gram speculation; then bf16
# parity with mlx-lm.
set -euo pipefail
source tests/bench/gpu/device_env.sh
family_shapes
M=/tmp/f/qwen3_5-small
echo "## generate (new prompt length per process)"
python3 tests/bench/bench_variants.py --host $H --plugins $P --gen 128 --reps 3 --model $M --prompt-ids $IDS \
  --variant "fused conv=" --variant "conv1d=--model-option conv=mlx" | tee $OUT/conv_generate.md
[ -d $M-cycle ] || { mkdir -p $M-cycle && python3 models/scripts/make_cycle.py $M $M-cycle; }
for conv in fused mlx; do
  echo "## batched speculation, conv=$conv"
  python3 tests/bench/bench_spec_batch.py --host $H --plugins $P --model $M-cycle --concurrency 4 --gen 96 --reps 2 \
    --extra="--model-option conv=$conv" \
    --variant "ngram-always=--draft-kind ngram --speculate-always" --variant "ngram=--draft-kind ngram"
done 2>&1 | tee $OUT/conv_spec.md
echo "## parity"; bash tests/bench/gpu/device_bf16_parity.sh /tmp/f qwen3_5-small 2>&1 | grep "^|"
