#!/usr/bin/env bash
# H200: `host generate` decode of this build against another (its pack at
# .devpack_b/device.tar.xz) on the 8B-scale hybrid (make_drafter_shapes.py's
# qwen3_5-8b), plain and with its always-accepted MTP head (2 drafts), one
# process per run, the two builds alternated, ROUNDS rounds: decode tok/s
# and whether the tokens equal the first run's. Second of two device calls
# (.gpu_b + .devpack + .devpack_b). `device_build_ab.sh [ROUNDS]`
set -euo pipefail
source tests/bench/gpu/device_env.sh
M=/tmp/d/qwen3_5-8b
drafter_shape qwen3_5
other_build
IDS=$(ids 64 64)
rm -f /tmp/first.*.json
{
  echo "| round | build | run | decode tok/s | tokens equal the first run's |"
  echo "|---|---|---|---|---|"
  for r in $(seq ${1:-2}); do
    for run in plain mtp; do
      args=(); [ $run = mtp ] && args=(--draft-model $M/mtp-agree --speculate-always)
      for side in other this; do
        side_build $side
        $BIN generate --plugins $PL --model $M --prompt-ids $IDS --max-tokens 256 --ignore-eos --json --warmup "${args[@]}" > /tmp/ab.json
        [ -f /tmp/first.$run.json ] || cp /tmp/ab.json /tmp/first.$run.json
        python3 -c "import json,sys; a=json.load(open('/tmp/ab.json')); f=json.load(open('/tmp/first.$run.json')); print(f'| $r | $side | $run | {a[\"decode_tokens_per_s\"]:.1f} | {a[\"tokens\"]==f[\"tokens\"]} |')"
      done
    done
  done
} 2>&1 | tee $OUT/build_ab.md
