#!/usr/bin/env bash
# H200: the families against mlx-lm at a small shape, n-gram with the real
# default model (4-bit), and HTTP against mlx_lm.server on the Qwen3-0.6B
# shape. Last of four device calls: expects /tmp/mlxparts/{part_aa,smq4_aa,
# smq4_ab} from the earlier calls (the CUDA wheel's first half, and the 4-bit
# default model in two halves from pack_smollm2_q4.sh), .gpu_b and .devpack
# (pack_device.sh).
set -euo pipefail
source tests/bench/gpu/device_env.sh
smollm2_q4
$H plugins --plugins $P | head -12
echo "## families"; family_shapes
python3 tests/bench/bench_generate.py --host $H --plugins $P --model /tmp/f/qwen3_5-small --model /tmp/f/qwen3_moe-small \
  --model /tmp/f/gemma3-small --model /tmp/f/gemma4-small --prompt-len 512 --gen 128 --reps 2 | tee $OUT/families.md
echo "## ngram, default model (4-bit)"; python3 tests/bench/bench_ngram.py --host $H --plugins $P --model /tmp/smollm2-q4 --gen 256 | tee $OUT/ngram_real.md
echo "## http"; qwen06b
python3 tests/bench/bench_http.py --host $H --plugins $P --model /tmp/m/qwen3-0.6b --per-client 2 --max-tokens 128 --concurrency 1,4,8,16 | tee $OUT/http.md
