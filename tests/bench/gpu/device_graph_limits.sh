#!/usr/bin/env bash
# H100/H200: MLX's CUDA graph limits on a host-bound MTP round. MLX 0.32
# commits a CUDA graph every MLX_MAX_OPS_PER_BUFFER nodes or
# MLX_MAX_MB_PER_BUFFER million input elements (100 and 1000 on compute
# capability 9.0; about 8 graphs per 8B plain step, 10 per round). Bigger
# graphs mean fewer launches and updates; smaller ones let the device
# start sooner. The 8B-scale hybrid and its always-accepted MTP head (2
# drafts), one process per run, variants alternated, ROUNDS rounds: decode
# tok/s, the rounds' median build / launch / wait ms (the trace), tokens
# against the first run (plain steps, device-bound, once: default and big).
# Second of two device calls (.gpu_b + .devpack).
# `device_graph_limits.sh [ROUNDS]`
set -euo pipefail
source tests/bench/gpu/device_env.sh
M=/tmp/d/qwen3_5-8b
drafter_shape qwen3_5
IDS=$(ids 64 64)
declare -A ENVS=([default]="" [big]="MLX_MAX_OPS_PER_BUFFER=200 MLX_MAX_MB_PER_BUFFER=100000" [small]="MLX_MAX_OPS_PER_BUFFER=50")
rm -f /tmp/first.*.json
{
  echo "| round | graphs | run | decode tok/s | median build / launch / wait ms | tokens equal the first run's |"
  echo "|---|---|---|---|---|---|"
  for r in $(seq ${1:-2}); do
    for v in default big small; do
      for run in mtp plain; do
        # plain steps are device-bound: the big graphs in the first round only
        [ $run = plain ] && { [ $v = small ] || [ $r -gt 1 ]; } && continue
        args=(); [ $run = mtp ] && args=(--draft-model $M/mtp-agree --speculate-always)
        env ${ENVS[$v]} RUST_LOG=host_engine::spec=trace,host_engine::step=trace $H generate --plugins $P --model $M --prompt-ids $IDS \
          --max-tokens 256 --ignore-eos --json --warmup "${args[@]}" > /tmp/gl.json 2> /tmp/gl.log
        [ -f /tmp/first.$run.json ] || cp /tmp/gl.json /tmp/first.$run.json
        if [ $run = mtp ]; then
          t=$(python3 tests/bench/traces.py /tmp/gl.log --target host_engine::spec --event "speculative round" --last 60 --fields build_ms,launch_ms,wait_ms | tail -1)
        else
          t=$(python3 tests/bench/traces.py /tmp/gl.log --target host_engine::step --event "plain step" --last 60 --fields graph_ms,launch_ms | tail -1)
        fi
        python3 -c "import json; a=json.load(open('/tmp/gl.json')); f=json.load(open('/tmp/first.$run.json')); print(f'| $r | $v | $run | {a[\"decode_tokens_per_s\"]:.1f} | $t | {a[\"tokens\"]==f[\"tokens\"]} |')"
      done
    done
  done
} 2>&1 | tee $OUT/graph_limits.md
