#!/usr/bin/env bash
# H200: `host generate` decode of this build against another (its pack at
# .devpack_b/device.tar.xz), one process per run, the two builds
# alternated, ROUNDS rounds: decode tok/s and whether the tokens equal the
# first run's (else the first token where they part). The runs (AB_RUNS):
# `hybrid:plain` and `hybrid:mtp`, the 8B-scale hybrid
# (make_drafter_shapes.py's qwen3_5-8b) alone and with its always-accepted
# MTP head (2 drafts), the default; `qwen3-8b:plain`, the Qwen3-8B shape
# (make_shape.py). Second of two device calls (.gpu_b + .devpack +
# .devpack_b). `[AB_RUNS="..."] [AB_SEED=N] device_build_ab.sh [ROUNDS]`
set -euo pipefail
source tests/bench/gpu/device_env.sh
other_build
IDS=$(ids ${AB_SEED:-64} 64)   # AB_SEED picks another prompt
rm -f /tmp/first.*.json
{
  echo "| round | build | model, run | decode tok/s | tokens equal the first run's |"
  echo "|---|---|---|---|---|"
  for r in $(seq ${1:-2}); do
    for ab in ${AB_RUNS:-hybrid:plain hybrid:mtp}; do
      model=${ab%%:*}; run=${ab#*:}
      if [ $model = hybrid ]; then drafter_shape qwen3_5; M=/tmp/d/qwen3_5-8b; else shape $model; M=/tmp/m/$model; fi
      args=(); [ $run = mtp ] && args=(--draft-model $M/mtp-agree --speculate-always)
      for side in other this; do
        side_build $side
        $BIN generate --plugins $PL --model $M --prompt-ids $IDS --max-tokens 256 --ignore-eos --json --warmup "${args[@]}" > /tmp/ab.json
        cp /tmp/ab.json $OUT/run.$r.$side.$model.$run.json
        [ -f /tmp/first.$model.$run.json ] || cp /tmp/ab.json /tmp/first.$model.$run.json
        echo "| $r | $side | $model $run | $(decode_vs /tmp/ab.json /tmp/first.$model.$run.json) |"
      done
    done
  done
} 2>&1 | tee $OUT/build_ab.md
