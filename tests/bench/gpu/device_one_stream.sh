#!/usr/bin/env bash
# One stream's step time on the H200 (second of two device calls: .gpu_a
# first, then .gpu_b + .devpack running this), Qwen3-0.6B shape: requests
# one at a time, interleaved, their steps timed by the server's trace
# (one_stream_steps.py): streamed or not, prefix cache off, hits against
# misses, the server pinned to different cores.
set -euo pipefail
source tests/bench/gpu/device_env.sh
qwen06b
cd tests/bench
run() { python3 one_stream_steps.py --host ../../$H --plugins ../../$P --model /tmp/m/qwen3-0.6b "$@"; }
{
  echo "## plain / stream / raw"; run --extra "--batch 32"
  echo "## --prompt-cache 0"; run --extra "--batch 32 --prompt-cache 0"
  echo "## misses and hits"; run --modes miss,hit --repeats 4 --extra "--batch 32"
  for cores in 0-3 8-11 12-15 0-15; do
    echo "## taskset -c $cores"; run --modes plain --repeats 4 --taskset $cores --extra "--batch 32"
  done
} 2>&1 | tee $OUT/one_stream.txt
