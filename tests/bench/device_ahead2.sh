#!/usr/bin/env bash
# H200: n-gram rounds queued ahead only inside full-accept streaks (auto)
# against one at a time (off), on the agreeing pair's cyclic output and on
# copy/edit chat prompts with the real default model (4-bit). Four device
# calls: .gpu_a, .gpu_m1, .gpu_m2, then .gpu_b + .devpack running this.
set -euo pipefail
[ -d .device ] || tar -xJf .devpack/device.tar.xz
source tests/bench/device_env.sh
[ -d /tmp/m/pair-0.02 ] || python3 tests/bench/make_spec_pair.py --out /tmp/m/pair-0.02 --eps 0.02 --tokenizer-from .device/tok > /dev/null
IDS=$(python3 -c "import random; r=random.Random(0); print(','.join(str(r.randrange(100,49000)) for _ in range(64)))")
B="python3 tests/bench/bench_ahead.py --host $H --plugins $P --gen 128"
N="--draft-kind ngram --speculate-always"
echo "## 28-layer target (eps 0.02), n-gram on its cyclic output"
$B --reps 4 --model /tmp/m/pair-0.02/target --prompt-ids $IDS --variant "plain=" \
  --variant "n-gram k4, ahead (auto)=$N --num-draft-tokens 4" --variant "n-gram k4, one at a time=$N --num-draft-tokens 4 --draft-ahead off" \
  --variant "n-gram k10, ahead (auto)=$N" --variant "n-gram k10, one at a time=$N --draft-ahead off" | tee $OUT/pair.md
[ -d /tmp/smollm2-q4 ] || cat /tmp/mlxparts/smq4_aa /tmp/mlxparts/smq4_ab | tar -C /tmp -xf -
TEXT="The quick brown fox jumps over the lazy dog. The dog sleeps under the old oak tree while the fox runs across the green field towards the river, where a family of ducks swims slowly in the sun."
i=0
for chat in "Repeat this text exactly, word for word:

$TEXT" "Rewrite this text, replacing every 'fox' with 'cat' and changing nothing else:

$TEXT"; do
  i=$((i+1)); echo "## SmolLM2-135M-Instruct 4-bit, copy/edit prompt $i (answer ends at EOS)"
  $B --reps 3 --stop-at-eos --model /tmp/smollm2-q4 --chat "$chat" --variant "plain=" \
    --variant "n-gram k10, ahead (auto)=--draft-kind ngram" --variant "n-gram k10, one at a time=--draft-kind ngram --draft-ahead off" \
    --variant "n-gram k4, ahead (auto)=--draft-kind ngram --num-draft-tokens 4" --variant "n-gram k4, one at a time=--draft-kind ngram --num-draft-tokens 4 --draft-ahead off" | tee $OUT/real_$i.md
done
