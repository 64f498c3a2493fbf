#!/usr/bin/env bash
# The H200 generation, two-model and HTTP run (second of two device calls;
# tests/bench/README.md, "GPU runs"). Expects /tmp/mlxparts/part_aa from the
# first call, .gpu_b and .devpack (pack_device.sh).
set -euo pipefail
source tests/bench/gpu/device_env.sh
$H --version | tee $OUT/version.txt
$H plugins --plugins $P | head -3
qwen06b
python3 tests/bench/make_shape.py --out /tmp/m/qwen3-tiny --preset qwen3-tiny --tokenizer-from .device/tok
echo "## generate"; python3 tests/bench/bench_generate.py --host $H --plugins $P --model /tmp/m/qwen3-0.6b --model /tmp/m/qwen3-tiny --prompt-len 512 --gen 128 --reps 2 | tee $OUT/generate.md
echo "## speculation"; python3 tests/bench/bench_spec.py --host $H --plugins $P --model /tmp/m/qwen3-0.6b --draft "random qwen3-tiny=/tmp/m/qwen3-tiny" --gen 128 --k 3 | tee $OUT/spec.md
echo "## http"; python3 tests/bench/bench_http.py --host $H --plugins $P --model /tmp/m/qwen3-0.6b --per-client 2 --max-tokens 128 --concurrency 1,4,8,16 | tee $OUT/http.md
echo "## http --batch 16"; python3 tests/bench/bench_http.py --host $H --plugins $P --model /tmp/m/qwen3-0.6b --per-client 2 --max-tokens 128 --concurrency 16 --extra="--batch 16" | tee $OUT/http16.md
