#!/usr/bin/env bash
# H200, the families and n-gram run (last of four device calls; see
# docs/benchmarks.md): expects /tmp/mlxparts/{part_aa,smq4_aa,smq4_ab} from the
# earlier calls (the CUDA wheel's first half and the 4-bit default model in two
# halves), .gpu_b and .devpack/device.tar.xz (tests/bench/pack_device.sh's .device, compressed).
set -euo pipefail
source tests/bench/device_env.sh
cat /tmp/mlxparts/smq4_aa /tmp/mlxparts/smq4_ab | tar -C /tmp -xf -
$H plugins --plugins $P | head -12
echo "## families"; family_shapes
python3 tests/bench/bench_generate.py --host $H --plugins $P --model /tmp/f/qwen3_5-small --model /tmp/f/qwen3_moe-small \
  --model /tmp/f/gemma3-small --model /tmp/f/gemma4-small --prompt-len 512 --gen 128 --reps 2 | tee $OUT/families.md
echo "## ngram, default model (4-bit)"; python3 tests/bench/bench_ngram.py --host $H --plugins $P --model /tmp/smollm2-q4 --gen 256 | tee $OUT/ngram_real.md
echo "## http"; qwen06b
python3 tests/bench/bench_http.py --host $H --plugins $P --model /tmp/m/qwen3-0.6b --requests 16 --max-tokens 128 --concurrency 1,4,8,16 | tee $OUT/http.md
