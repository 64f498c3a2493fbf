#!/usr/bin/env bash
# H200: batched n-gram speculation, 4 concurrent requests, over the hybrid
# (qwen3_5-small: recurrent state, padded replay) and a KV-only family
# (Qwen3-0.6B shape), both turned into cycling folders by make_cycle.py.
set -euo pipefail
source tests/bench/gpu/device_env.sh
qwen06b; family_shapes
for src in /tmp/f/qwen3_5-small /tmp/m/qwen3-0.6b; do
  dst=$src-cycle
  [ -d $dst ] || { mkdir -p $dst && python3 models/scripts/make_cycle.py $src $dst; }
  echo "--- $(basename $dst)"
  python3 tests/bench/bench_spec_batch.py --host $H --plugins $P --model $dst --concurrency 4 --gen 96 --reps 3 \
    --variant "ngram-always=--draft-kind ngram --speculate-always" --variant "ngram=--draft-kind ngram"
done 2>&1 | tee $OUT/spec_batch.md
