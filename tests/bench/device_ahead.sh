#!/usr/bin/env bash
# H200: pipelined speculative rounds (--draft-ahead on) against rounds one
# at a time (off) and plain decoding: two-model with the agreeing 2-layer
# draft and n-gram on its cyclic output; then n-gram on copy/edit chat
# prompts with the real default model (4-bit), answers ending at EOS.
# Four device calls: .gpu_a, .gpu_m1, .gpu_m2, then .gpu_b + .devpack.
set -euo pipefail
source tests/bench/device_env.sh
pair 0.02
B="python3 tests/bench/bench_ahead.py --host $H --plugins $P --gen 128"
N="--draft-kind ngram --speculate-always"
D="--draft-model /tmp/m/pair-0.02/draft --num-draft-tokens 3 --speculate-always"
echo "## 28-layer target (eps 0.02): two-model with the 2-layer draft, n-gram on its cyclic output"
$B --reps 4 --model /tmp/m/pair-0.02/target --prompt-ids $IDS --variant "plain=" \
  --variant "two-model k3, ahead=$D --draft-ahead on" --variant "two-model k3, one at a time=$D --draft-ahead off" \
  --variant "n-gram k4, ahead=$N --num-draft-tokens 4 --draft-ahead on" --variant "n-gram k4, one at a time=$N --num-draft-tokens 4 --draft-ahead off" \
  --variant "n-gram k10, ahead=$N --draft-ahead on" --variant "n-gram k10, one at a time=$N --draft-ahead off" | tee $OUT/pair.md
[ -d /tmp/smollm2-q4 ] || cat /tmp/mlxparts/smq4_aa /tmp/mlxparts/smq4_ab | tar -C /tmp -xf -
TEXT="The quick brown fox jumps over the lazy dog. The dog sleeps under the old oak tree while the fox runs across the green field towards the river, where a family of ducks swims slowly in the sun."
i=0
for chat in "Repeat this text exactly, word for word:

$TEXT" "Rewrite this text, replacing every 'fox' with 'cat' and changing nothing else:

$TEXT"; do
  i=$((i+1)); echo "## SmolLM2-135M-Instruct 4-bit, copy/edit prompt $i (answer ends at EOS)"
  $B --reps 3 --stop-at-eos --model /tmp/smollm2-q4 --chat "$chat" --variant "plain=" \
    --variant "n-gram k10, ahead=--draft-kind ngram --draft-ahead on" --variant "n-gram k10, one at a time=--draft-kind ngram --draft-ahead off" \
    --variant "n-gram k4, ahead=--draft-kind ngram --num-draft-tokens 4 --draft-ahead on" --variant "n-gram k4, one at a time=--draft-kind ngram --num-draft-tokens 4 --draft-ahead off" | tee $OUT/real_$i.md
done
