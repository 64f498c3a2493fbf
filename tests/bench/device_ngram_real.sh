#!/usr/bin/env bash
# H200: n-gram speculation with the real default model (4-bit), as in
# device_families.sh's second part, alone (four device calls: .gpu_a,
# .gpu_m1, .gpu_m2, then .gpu_b + .devpack running this).
set -euo pipefail
source tests/bench/device_env.sh
[ -d /tmp/smollm2-q4 ] || cat /tmp/mlxparts/smq4_aa /tmp/mlxparts/smq4_ab | tar -C /tmp -xf -
python3 tests/bench/bench_ngram.py --host $H --plugins $P --model /tmp/smollm2-q4 --gen 256 | tee $OUT/ngram_real.md
