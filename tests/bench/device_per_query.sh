#!/usr/bin/env bash
# H200: verify rounds with per-query fused attention (the default) against
# the unfused matmul path (MLX_ENGINE_PER_QUERY_MAX=0), serial rounds one at
# a time and pipelined; plain decoding as the reference.
set -euo pipefail
[ -d .device ] || tar -xJf .devpack/device.tar.xz
source tests/bench/device_env.sh
[ -d /tmp/m/pair-0.02 ] || python3 tests/bench/make_spec_pair.py --out /tmp/m/pair-0.02 --eps 0.02 --tokenizer-from .device/tok > /dev/null
IDS=$(python3 -c "import random; r=random.Random(0); print(','.join(str(r.randrange(100,49000)) for _ in range(64)))")
D="--draft-model /tmp/m/pair-0.02/draft --num-draft-tokens 3 --speculate-always"
N="--draft-kind ngram --num-draft-tokens 4 --speculate-always"
OFF="env:MLX_ENGINE_PER_QUERY_MAX=0"
python3 tests/bench/bench_ahead.py --host $H --plugins $P --gen 128 --reps 3 --model /tmp/m/pair-0.02/target --prompt-ids $IDS \
  --variant "plain=" --variant "two-model, per-query, ahead=$D" --variant "two-model, per-query, one at a time=$D --no-draft-ahead" \
  --variant "two-model, unfused, ahead=$OFF $D" --variant "n-gram k4, per-query, ahead=$N" --variant "n-gram k4, per-query, one at a time=$N --no-draft-ahead" \
  --variant "n-gram k4, unfused, ahead=$OFF $N" --variant "n-gram k10, per-query, ahead=--draft-kind ngram --speculate-always" | tee $OUT/per_query.md
HOST_SPEC_TRACE=1 $H generate --plugins $P --model /tmp/m/pair-0.02/target --prompt-ids $IDS --max-tokens 128 --ignore-eos --json --warmup $N 2>$OUT/trace.txt >/dev/null
grep width $OUT/trace.txt | tail -5
