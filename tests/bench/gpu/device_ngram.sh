#!/usr/bin/env bash
# H200: plain vs n-gram speculation on a random Qwen3-0.6B-shaped model whose
# greedy output falls into repeating cycles (as random models do), so n-gram
# drafts are often right. Same set-up as device_run.sh (second device call).
set -euo pipefail
source tests/bench/gpu/device_env.sh
qwen06b
IDS=$(ids 1 32)
for extra in "" "--draft-kind ngram --num-draft-tokens 4" "--draft-kind ngram --num-draft-tokens 8"; do
  $H generate --plugins $P --model /tmp/m/qwen3-0.6b --prompt-ids $IDS --max-tokens 256 --ignore-eos --json --warmup $extra \
    | python3 -c "import json,sys; d=json.load(sys.stdin); s=d.get('speculation') or {}; print('| ${extra:-plain} | %.1f | %s | %s |' % (d['decode_tokens_per_s'], s.get('acceptance'), s.get('rounds')), d['tokens'][-12:])"
done | tee $OUT/ngram.md
