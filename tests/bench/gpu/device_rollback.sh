#!/usr/bin/env bash
# H200: speculative rollback over the hybrid's recurrent layers by the
# verify's position states (the default) against the replay of the kept
# tokens (`--model-option rollback=replay`), after device_drafters.sh made
# /tmp/d/qwen3_5-8b. Greedy tokens of `host generate` (64-token prompt,
# 128 tokens): plain, then each drafter with each rollback, the first
# position where each parts from plain and its replay count. TINY as in
# device_delta.sh (n-gram drafts on the tiny folder).
TINY=${TINY:-models/tiny/tiny-qwen3_5-bf16}
set -euo pipefail
source tests/bench/gpu/device_env.sh
gen() { $H generate --plugins $P --prompt-ids $IDS --max-tokens 128 --ignore-eos --json --warmup "$@" 2>/dev/null | tail -1; }
cmp() {
  python3 -c "
import json, sys
plain, spec = json.loads(sys.argv[1]), json.loads(sys.argv[2])
a, b = plain['tokens'], spec['tokens']
first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
sp = spec.get('speculation') or {}
print(f\"| {sys.argv[3]} | {'identical' if first is None else f'parts at {first}'} | {sp.get('acceptance', 0):.2f} | {sp.get('replays')} | {spec['decode_tokens_per_s']:.1f} |\")
" "$1" "$2" "$3"
}
echo "| run | tokens against plain | acceptance | replays | decode tok/s |"
echo "|---|---|---|---|---|"
{
  plain=$(gen --model $TINY --dtype native)
  for rb in states replay; do
    cmp "$plain" "$(gen --model $TINY --dtype native --draft-kind ngram --speculate-always --model-option rollback=$rb)" "tiny, ngram, rollback=$rb"
  done
  plain=$(gen --model /tmp/d/qwen3_5-8b)
  for d in mtp-rand mtp-agree; do
    for rb in states replay; do
      cmp "$plain" "$(gen --model /tmp/d/qwen3_5-8b --draft-model /tmp/d/qwen3_5-8b/$d --speculate-always --model-option rollback=$rb)" "qwen3_5-8b, $d, rollback=$rb"
    done
  done
} | tee $OUT/rollback.md
