#!/usr/bin/env bash
# H200 diagnosis: where a target-state drafter's round goes (the trace
# events of target host_engine::spec: draft_ms, build_ms = building and
# launching the verify, launch_ms = the launch part of it, wait_ms = waiting
# for the device), on the
# always-rejected drafters of device_drafters.sh (make_drafter_shapes.py),
# against the plain steps of the same targets.
set -euo pipefail
source tests/bench/gpu/device_env.sh
# TARGETS picks the folders to make (default both).
for t in ${TARGETS:-qwen3 qwen3_5}; do
  drafter_shape $t
done
# RUNS picks runs by name (default all).
run() {
  local name=$1 model=$2; shift 2
  [ -z "${RUNS:-}" ] || [[ " $RUNS " == *" $name "* ]] || return 0
  RUST_LOG=host_engine=trace $H generate --plugins $P --model $model --prompt-ids $IDS --max-tokens 128 --ignore-eos --json --warmup "$@" \
    2>$OUT/trace_$name.txt | python3 -c "import json,sys; d=json.load(sys.stdin); s=d.get('speculation') or {}; print('$name decode', round(d['decode_tokens_per_s'],1), s.get('acceptance'))"
}
run plain-qwen3 /tmp/d/qwen3-8b
run plain-qwen3_5 /tmp/d/qwen3_5-8b
run mtp-rand /tmp/d/qwen3_5-8b --draft-model /tmp/d/qwen3_5-8b/mtp-rand --speculate-always
run mtp-agree /tmp/d/qwen3_5-8b --draft-model /tmp/d/qwen3_5-8b/mtp-agree --speculate-always
run dflash-rand /tmp/d/qwen3-8b --draft-model /tmp/d/qwen3-8b/dflash-rand --speculate-always
run dflash-rand-k2 /tmp/d/qwen3-8b --draft-model /tmp/d/qwen3-8b/dflash-rand --speculate-always --num-draft-tokens 2
for f in $(ls $OUT/trace_plain-*.txt 2>/dev/null); do
  echo "== $f (the measured run's last 60 plain steps)"
  python3 tests/bench/traces.py $f --target host_engine::step --event "plain step" --last 60
done
for f in $(ls $OUT/trace_mtp-*.txt $OUT/trace_dflash-*.txt 2>/dev/null); do
  echo "== $f (the measured run: its last 40 rounds)"
  python3 tests/bench/traces.py $f --target host_engine::spec --event "speculative round" --last 40 --fields draft_ms,build_ms,launch_ms,wait_ms,accepted
done
