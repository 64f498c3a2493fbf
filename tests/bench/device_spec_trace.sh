#!/usr/bin/env bash
# H200 diagnosis: where a speculative round's time goes (HOST_SPEC_TRACE),
# with the default attention path, in a cold process and after a warm-up on
# a longer prompt (no shape of the measured run seen before).
set -euo pipefail
source tests/bench/device_env.sh
python3 tests/bench/make_spec_pair.py --out /tmp/m/pair --eps 0.1 --tokenizer-from .device/tok --check-tokens 4
IDS=$(python3 -c "import random; r=random.Random(0); print(','.join(str(r.randrange(100,49000)) for _ in range(64)))")
run() { local name=$1; shift; HOST_SPEC_TRACE=1 $H generate --plugins $P --model /tmp/m/pair/target --prompt-ids $IDS --max-tokens 128 --ignore-eos --json "$@" 2>$OUT/trace_$name.txt | python3 -c "import json,sys; d=json.load(sys.stdin); print('decode', round(d['decode_tokens_per_s'],1), (d.get('speculation') or {}).get('acceptance'), (d.get('speculation') or {}).get('disabled'))"; }
echo plain-warm; run plain-warm --warmup
echo pair-k3-warm; run pair-k3-warm --warmup --draft-model /tmp/m/pair/draft --num-draft-tokens 3 --speculate-always
echo ngram-k4-warm; run ngram-k4-warm --warmup --draft-kind ngram --num-draft-tokens 4 --speculate-always
echo pair-k3-judged; run pair-k3-judged --warmup --draft-model /tmp/m/pair/draft --num-draft-tokens 3
for f in $OUT/trace_*-warm.txt; do
  echo "== $f (the measured run: its last 40 rounds)"
  grep "spec-trace width" $f | tail -40 | python3 -c "
import sys,statistics as st
rows=[dict(kv.split('=') for kv in l.split()[1:]) for l in sys.stdin]
for k in ('draft_ms','verify_ms','rollback_ms'):
    v=[float(r[k]) for r in rows]; print(k, 'median', round(st.median(v),2), 'max', round(max(v),2))
print('accepted mean', round(st.mean(int(r['accepted']) for r in rows),2), 'width', st.mode(r['width'] for r in rows))"
done
