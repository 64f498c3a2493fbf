#!/usr/bin/env bash
# H200 A/B: prefill that evaluates the cache states (HEAD, .device/host) vs
# the same build evaluating the final hidden state (.device/host_hidden),
# on HTTP time-to-first-token and generate prefill. Same set-up as
# device_families.sh (second device call after .gpu_a).
set -euo pipefail
source tests/bench/device_env.sh
qwen06b
for bin in host host_hidden; do
  echo "## $bin"
  python3 tests/bench/bench_generate.py --host .device/$bin --plugins $P --model /tmp/m/qwen3-0.6b --prompt-len 40 --gen 64 --reps 2 | tail -3
  python3 tests/bench/bench_http.py --host .device/$bin --plugins $P --model /tmp/m/qwen3-0.6b --requests 16 --max-tokens 128 --concurrency 1,4
done | tee $OUT/ab.md
