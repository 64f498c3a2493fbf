#!/usr/bin/env bash
# H200 diagnosis of pipelined rounds: per-round draft/build/wait/settle ms
# (HOST_SPEC_TRACE) for two-model and n-gram, ahead and one at a time, on
# the agreeing pair; and where a speculative run's greedy output first
# leaves the plain one, with plain's top-2 logprob margin there.
set -euo pipefail
source tests/bench/device_env.sh
for e in ${EPS:-0.02 0.1}; do pair $e; done
G="$H generate --plugins $P --prompt-ids $IDS --max-tokens 128 --ignore-eos --json --warmup"
summ() { grep "spec-trace width" $1 | tail -30 | python3 -c "
import sys,statistics as st
rows=[dict(kv.split('=') for kv in l.split()[1:]) for l in sys.stdin]
print(' '.join(f\"{k} {st.median(float(r[k]) for r in rows):.2f}\" for k in ('draft_ms','graph_ms','launch_ms','build_ms','wait_ms','settle_ms')), 'accepted', round(st.mean(int(r['accepted']) for r in rows),2))"; }
HOST_STEP_TRACE=1 $G --model /tmp/m/pair-0.02/target 2>/tmp/st.txt >/dev/null
echo "plain steps: $(grep step-trace /tmp/st.txt | tail -60 | python3 -c "
import sys,statistics as st
rows=[dict(kv.split('=') for kv in l.split()[1:]) for l in sys.stdin]
print(' '.join(f\"{k} {st.median(float(r[k]) for r in rows):.2f}\" for k in ('graph_ms','launch_ms')))")"
for e in ${EPS:-0.02 0.1}; do
  M=/tmp/m/pair-$e/target; D="--draft-model /tmp/m/pair-$e/draft --num-draft-tokens 3 --speculate-always"
  for v in "two-model ahead::$D --draft-ahead on" "two-model sync::$D --draft-ahead off" "ngram ahead::--draft-kind ngram --num-draft-tokens 4 --speculate-always --draft-ahead on" "ngram sync::--draft-kind ngram --num-draft-tokens 4 --speculate-always --draft-ahead off"; do
    name=${v%%::*}; args=${v#*::}
    HOST_SPEC_TRACE=1 $G --model $M $args 2>/tmp/tr.txt > /tmp/o.json
    echo "eps $e $name: $(python3 -c "import json; d=json.load(open('/tmp/o.json')); s=d['speculation']; print(round(d['decode_tokens_per_s'],1), s['acceptance'], s['ahead_rounds'], s['ahead_voided'])") | $(summ /tmp/tr.txt)"
    cp /tmp/tr.txt $OUT/trace_${e}_${name// /_}.txt; cp /tmp/o.json $OUT/out_${e}_${name// /_}.json
  done
  $G --model $M --logprobs 2 > $OUT/plain_$e.json
  python3 - $OUT/plain_$e.json $OUT/out_${e}_two-model_sync.json $OUT/out_${e}_ngram_sync.json <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
for f in sys.argv[2:]:
    s = json.load(open(f))
    i = next((i for i, (a, b) in enumerate(zip(p["tokens"], s["tokens"])) if a != b), None)
    if i is None:
        print(f, "identical"); continue
    lp = p.get("logprobs") or p.get("token_logprobs")
    print(f, "first difference at", i, "plain", p["tokens"][i], "spec", s["tokens"][i], "plain top-2 there:", lp[i] if lp else list(p.keys()))
PY
done
