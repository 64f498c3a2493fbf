#!/usr/bin/env bash
# H200: where an MTP round's host time goes, against a plain step's, on the
# hybrid at the 8B scale (make_drafter_shapes.py's qwen3_5-8b and its
# always-accepted MTP head): the CUDA timeline of each (cupti_trace.c, read
# by timeline.py), the last 40 plain steps and the last 40 rounds, with the
# host API calls per step / round by name (launches, allocations, cuBLAS's
# and cuDNN's calls), then, with perf (the machine's or the kit pack_device.sh adds), the host functions
# under each run (MLX's launch of the graph). Second of two device calls
# (.gpu_b + .devpack). First, both runs untraced with the host's split
# of a step and of a round (`cpu_ms`: the thread's own CPU time, waits for
# the device left out). PERF_ONLY=1: the perf profiles alone;
# UNTRACED_ONLY=1: the untraced split and perf, no CUDA trace;
# PERF_RUNS="mtp": one of the profiles.
set -euo pipefail
source tests/bench/gpu/device_env.sh
drafter_shape qwen3_5
source tests/bench/gpu/build_cupti_trace.sh
export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$CUPTI_LIB"
IDS=$(ids 64 64)
gen() { $H generate --plugins $P --model /tmp/d/qwen3_5-8b --prompt-ids $IDS --max-tokens 128 --ignore-eos --json --warmup "$@"; }
MTP=(--draft-model /tmp/d/qwen3_5-8b/mtp-agree --speculate-always)
{
  if [ -z "${PERF_ONLY:-}" ]; then
    # The host's split without the trace (CUPTI lengthens every CUDA call):
    # a round is bound by the host where the verdict is ready when read
    # (read_ms near 0) and queueing the next round outlasts the round.
    echo "## untraced: the last 40 plain steps, then the last 40 rounds"
    RUST_LOG=host_engine::step=trace gen > $OUT/plain_untraced.json 2> $OUT/plain_untraced.log
    python3 tests/bench/traces.py $OUT/plain_untraced.log --target host_engine::step --event "plain step" --last 40 --fields graph_ms,launch_ms,cpu_ms
    RUST_LOG=host_engine::spec=trace gen "${MTP[@]}" > $OUT/mtp_untraced.json 2> $OUT/mtp_untraced.log
    python3 tests/bench/traces.py $OUT/mtp_untraced.log --target host_engine::spec --event "speculative round" --last 40 --fields read_ms,ahead_ms,ahead_draft_ms,ahead_launch_ms,ahead_cpu_ms,cpu_ms,accepted
    for run in plain_untraced mtp_untraced; do
      python3 -c "import json,sys; print(sys.argv[1], round(json.load(open(sys.argv[2]))['decode_tokens_per_s'], 1), 'decode tok/s')" $run $OUT/$run.json
    done
    if [ -z "${UNTRACED_ONLY:-}" ]; then
    echo "## plain decode, the last 40 steps"
    RUST_LOG=host_engine::step=trace trace plain gen > $OUT/plain.json 2> $OUT/plain.log
    python3 tests/bench/gpu/timeline.py $OUT/plain.csv --rust-log $OUT/plain.log --last 40 --top-api 8 | tail -45
    echo "## MTP (agreeing head, 2 drafts), the last 40 rounds"
    RUST_LOG=host_engine::spec=trace trace mtp gen "${MTP[@]}" > $OUT/mtp.json 2> $OUT/mtp.log
    python3 tests/bench/gpu/timeline.py $OUT/mtp.csv --rust-log $OUT/mtp.log --target host_engine::spec --last 40 --top-api 8 | tail -45
    python3 tests/bench/traces.py $OUT/mtp.log --target host_engine::spec --event "speculative round" --last 40 --fields draft_ms,build_ms,launch_ms,wait_ms,read_ms,ahead_ms,ahead_draft_ms,ahead_launch_ms,accepted
    rm -f $OUT/plain.csv $OUT/mtp.csv
    fi
  fi
  if perf_kit; then
    for run in ${PERF_RUNS:-plain mtp}; do
      args=(); [ $run = mtp ] && args=("${MTP[@]}")
      echo "## perf: host functions under $run's decode, 5 s (self time, top 40)"
      # Attached by the trace's count of steps or rounds, so the profile
      # holds steady decoding only (not the load, prefill or first compiles).
      RUST_LOG=host_engine::step=trace,host_engine::spec=trace $H generate --plugins $P --model /tmp/d/qwen3_5-8b \
        --prompt-ids $IDS --max-tokens 1200 --ignore-eos --json --warmup "${args[@]}" > /dev/null 2> /tmp/perf.$run.log &
      pid=$!
      # Into the second request (--warmup's first, whose first rounds compile):
      # 1200 plain steps or 400 rounds of 3 tokens each.
      past=1300; [ $run = mtp ] && past=450
      until [ "$(grep -c "plain step\|speculative round" /tmp/perf.$run.log)" -gt $past ] || ! kill -0 $pid 2> /dev/null; do sleep 0.2; done
      if ! kill -0 $pid 2> /dev/null; then
        echo "(the decode ended before the profile could attach; its log's end:)"; tail -5 /tmp/perf.$run.log; continue
      fi
      # perf's status is not 0 even when it profiled, so judge by its data.
      rm -f /tmp/perf.$run
      "${PERF[@]}" record -q -e cpu-clock -F 1999 -o /tmp/perf.$run -p $pid -- sleep 5 2> /tmp/perf.$run.err || true
      [ -s /tmp/perf.$run ] || { echo "(perf recorded nothing:)"; tail -5 /tmp/perf.$run.err; }
      kill $pid 2> /dev/null || true; wait $pid 2> /dev/null || true
      "${PERF[@]}" report -i /tmp/perf.$run --no-children --sort dso,sym --stdio 2> /dev/null | grep -v '^#' | grep -v '^$' | head -40 || true
      echo "### by library"
      "${PERF[@]}" report -i /tmp/perf.$run --no-children --sort dso --stdio 2> /dev/null | grep -v '^#' | grep -v '^$' | head -12 || true
    done
  else
    echo "(no perf on this machine)"
  fi
} 2>&1 | tee $OUT/spec_timeline.md
