#!/usr/bin/env bash
# H200: verify rounds with per-query fused attention (the default) against
# the unfused matmul path (MLX_ENGINE_PER_QUERY_MAX=0), serial rounds one at
# a time and pipelined; plain decoding as the reference.
set -euo pipefail
source tests/bench/device_env.sh
pair 0.02
D="--draft-model /tmp/m/pair-0.02/draft --num-draft-tokens 3 --speculate-always"
N="--draft-kind ngram --num-draft-tokens 4 --speculate-always"
OFF="env:MLX_ENGINE_PER_QUERY_MAX=0"
python3 tests/bench/bench_ahead.py --host $H --plugins $P --gen 128 --reps 3 --model /tmp/m/pair-0.02/target --prompt-ids $IDS \
  --variant "plain=" --variant "two-model, per-query, ahead=$D --draft-ahead on" --variant "two-model, per-query, one at a time=$D --draft-ahead off" \
  --variant "two-model, unfused, ahead=$OFF $D --draft-ahead on" --variant "n-gram k4, per-query, ahead=$N --draft-ahead on" --variant "n-gram k4, per-query, one at a time=$N --draft-ahead off" \
  --variant "n-gram k4, unfused, ahead=$OFF $N --draft-ahead on" --variant "n-gram k10, per-query, ahead=--draft-kind ngram --speculate-always --draft-ahead on" | tee $OUT/per_query.md
HOST_SPEC_TRACE=1 $H generate --plugins $P --model /tmp/m/pair-0.02/target --prompt-ids $IDS --max-tokens 128 --ignore-eos --json --warmup $N --draft-ahead on 2>$OUT/trace.txt >/dev/null
grep width $OUT/trace.txt | tail -5
