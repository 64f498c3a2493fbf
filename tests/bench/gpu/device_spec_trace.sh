#!/usr/bin/env bash
# H200 diagnosis: where a speculative round's time goes (the trace events of
# target host_engine::spec: draft_ms, build_ms = building and launching the
# verify, wait_ms = waiting for the device), on the eps 0.1 pair, with a
# warm-up on a longer prompt (no shape of the measured run seen before).
set -euo pipefail
source tests/bench/gpu/device_env.sh
pair 0.1
M=/tmp/m/pair-0.1
run() {
  local name=$1; shift
  RUST_LOG=host_engine=trace $H generate --plugins $P --model $M/target --prompt-ids $IDS --max-tokens 128 --ignore-eos --json "$@" \
    2>$OUT/trace_$name.txt | python3 -c "import json,sys; d=json.load(sys.stdin); s=d.get('speculation') or {}; print('decode', round(d['decode_tokens_per_s'],1), s.get('acceptance'), s.get('disabled'))"
}
echo plain-warm; run plain-warm --warmup
echo pair-k3-warm; run pair-k3-warm --warmup --draft-model $M/draft --num-draft-tokens 3 --speculate-always
echo ngram-k4-warm; run ngram-k4-warm --warmup --draft-kind ngram --num-draft-tokens 4 --speculate-always
echo pair-k3-judged; run pair-k3-judged --warmup --draft-model $M/draft --num-draft-tokens 3
echo "== plain steps (the measured run's last 60)"
python3 tests/bench/traces.py $OUT/trace_plain-warm.txt --target host_engine::step --event "plain step" --last 60
for f in $OUT/trace_*k*-warm.txt $OUT/trace_pair-k3-judged.txt; do
  echo "== $f (the measured run: its last 40 rounds)"
  python3 tests/bench/traces.py $f --target host_engine::spec --event "speculative round" --last 40 --fields draft_ms,build_ms,wait_ms,accepted
done
