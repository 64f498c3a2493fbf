#!/usr/bin/env bash
# H200: two-model speculation at two agreement levels of the 28-layer /
# 2-layer pair, with the cost rule on and with --speculate-always, against
# plain decoding. Two device calls:
# .gpu_a, then .gpu_b + .devpack running this.
set -euo pipefail
source tests/bench/gpu/device_env.sh
for e in 0.1 0.02; do
  pair $e
  D="--draft-model /tmp/m/pair-$e/draft --num-draft-tokens 3"
  echo "## eps $e"
  python3 tests/bench/bench_variants.py --host $H --plugins $P --gen 128 --reps 3 --model /tmp/m/pair-$e/target --prompt-ids $IDS \
    --variant "plain=" --variant "two-model k3, cost rule on=$D" --variant "two-model k3, --speculate-always=$D --speculate-always" | tee $OUT/pair_$e.md
done
