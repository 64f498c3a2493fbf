#!/usr/bin/env bash
# H200: where an MTP round's host time goes, against a plain step's, on the
# hybrid at the 8B scale (make_drafter_shapes.py's qwen3_5-8b and its
# always-accepted MTP head): the CUDA timeline of each (cupti_trace.c, read
# by timeline.py), the last 40 plain steps and the last 40 rounds, with the
# host API calls per step / round by name (launches, allocations, cuBLAS's
# and cuDNN's calls), then, where the machine has perf, the host functions
# under each run (MLX's launch of the graph). Second of two device calls
# (.gpu_b + .devpack).
set -euo pipefail
source tests/bench/gpu/device_env.sh
[ -d /tmp/d/qwen3_5-8b ] || python3 tests/bench/make_drafter_shapes.py --out /tmp/d --only qwen3_5 --tokenizer-from .device/tok > /dev/null
source tests/bench/gpu/build_cupti_trace.sh
export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$CUPTI_LIB"
IDS=$(ids 64 64)
gen() { $H generate --plugins $P --model /tmp/d/qwen3_5-8b --prompt-ids $IDS --max-tokens 128 --ignore-eos --json --warmup "$@"; }
MTP=(--draft-model /tmp/d/qwen3_5-8b/mtp-agree --speculate-always)
{
  echo "## plain decode, the last 40 steps"
  RUST_LOG=host_engine::step=trace trace plain gen > $OUT/plain.json 2> $OUT/plain.log
  python3 tests/bench/gpu/timeline.py $OUT/plain.csv --rust-log $OUT/plain.log --last 40 --top-api 8 | tail -20
  echo "## MTP (agreeing head, 2 drafts), the last 40 rounds"
  RUST_LOG=host_engine::spec=trace trace mtp gen "${MTP[@]}" > $OUT/mtp.json 2> $OUT/mtp.log
  python3 tests/bench/gpu/timeline.py $OUT/mtp.csv --rust-log $OUT/mtp.log --target host_engine::spec --last 40 --top-api 8 | tail -20
  python3 tests/bench/traces.py $OUT/mtp.log --target host_engine::spec --event "speculative round" --last 40 --fields draft_ms,build_ms,launch_ms,wait_ms,accepted
  rm -f $OUT/plain.csv $OUT/mtp.csv
  if command -v perf > /dev/null; then
    for run in plain mtp; do
      args=(); [ $run = mtp ] && args=("${MTP[@]}")
      echo "## perf: host functions under $run (self time, top 40)"
      perf record -q -F 999 -g -o /tmp/perf.$run -- $H generate --plugins $P --model /tmp/d/qwen3_5-8b --prompt-ids $IDS \
        --max-tokens 256 --ignore-eos --json --warmup "${args[@]}" > /dev/null 2>&1
      perf report -i /tmp/perf.$run --no-children -g none --sort dso,sym --stdio 2> /dev/null | grep -v '^#' | grep -v '^$' | head -40
    done
  else
    echo "(no perf on this machine)"
  fi
} 2>&1 | tee $OUT/spec_timeline.md
