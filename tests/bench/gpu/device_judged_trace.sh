#!/usr/bin/env bash
# H200: per-round host times (trace events of host_engine::spec) of two-model
# speculation on the agreeing pair, with the cost rule on and with
# --speculate-always, one process each. Two device calls: .gpu_a, then
# .gpu_b + .devpack.
set -euo pipefail
source tests/bench/gpu/device_env.sh
pair 0.02
for v in "judged::" "always::--speculate-always"; do
  name=${v%%::*}
  RUST_LOG=host_engine=trace $H generate --plugins $P --model /tmp/m/pair-0.02/target --prompt-ids $IDS --max-tokens 128 --ignore-eos --json --warmup \
    --draft-model /tmp/m/pair-0.02/draft --num-draft-tokens 3 ${v#*::} 2>$OUT/t_$name.txt \
    | python3 -c "import json,sys; d=json.load(sys.stdin); print('$name', round(d['decode_tokens_per_s'],1), d['speculation']['rounds'], d['speculation'].get('disabled'))"
  python3 tests/bench/traces.py $OUT/t_$name.txt --target host_engine::spec --event "speculative round" --fields draft_ms,build_ms,wait_ms,accepted
done
