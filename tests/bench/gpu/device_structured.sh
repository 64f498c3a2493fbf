#!/usr/bin/env bash
# Constrained decoding on the H200 (second of two device calls: .gpu_a
# first, then .gpu_b + .devpack running this): 8 concurrent requests under
# a JSON Schema against the same 8 free (tests/bench/bench_structured.py),
# on the Qwen3-0.6B shape (bf16, random weights, SmolLM2 vocabulary); then
# the generation and HTTP figures of device_run.sh for the same shape.
set -euo pipefail
source tests/bench/gpu/device_env.sh
$H --version | tee $OUT/version.txt
qwen06b
echo "## structured"; python3 tests/bench/bench_structured.py --host $H --plugins $P --model /tmp/m/qwen3-0.6b --concurrency 8 --gen 256 --reps 3 | tee $OUT/structured.md
echo "## generate"; python3 tests/bench/bench_generate.py --host $H --plugins $P --model /tmp/m/qwen3-0.6b --prompt-len 512 --gen 128 --reps 2 | tee $OUT/generate.md
echo "## http"; python3 tests/bench/bench_http.py --host $H --plugins $P --model /tmp/m/qwen3-0.6b --per-client 2 --max-tokens 128 --concurrency 1,8,16 | tee $OUT/http.md
