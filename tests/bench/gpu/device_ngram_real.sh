#!/usr/bin/env bash
# H200: n-gram speculation with the real default model (4-bit), ours against
# mlx-lm's plain decoding (bench_ngram.py). Four device calls: .gpu_a,
# .gpu_m1, .gpu_m2 (pack_smollm2_q4.sh), then .gpu_b + .devpack running this.
set -euo pipefail
source tests/bench/gpu/device_env.sh
smollm2_q4
python3 tests/bench/bench_ngram.py --host $H --plugins $P --model /tmp/smollm2-q4 --gen 256 | tee $OUT/ngram_real.md
