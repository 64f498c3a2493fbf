#!/usr/bin/env bash
# H200: per-round host times (HOST_SPEC_TRACE) of two-model speculation on
# the agreeing pair, with the cost rule on and with --speculate-always, one
# process each. Two device calls: .gpu_a, then .gpu_b + .devpack.
set -euo pipefail
source tests/bench/device_env.sh
pair 0.02
for v in "judged::" "always::--speculate-always"; do
HOST_SPEC_TRACE=1 $H generate --plugins $P --model /tmp/m/pair-0.02/target --prompt-ids $IDS --max-tokens 128 --ignore-eos --json --warmup --draft-model /tmp/m/pair-0.02/draft --num-draft-tokens 3 ${v#*::} 2>$OUT/t_${v%%::*}.txt | python3 -c "import json,sys; d=json.load(sys.stdin); print('${v%%::*}', round(d['decode_tokens_per_s'],1), d['speculation']['rounds'])"
done
