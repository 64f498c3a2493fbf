#!/usr/bin/env bash
# H200: does MLX's CUDA sdpa serve short causal multi-token queries with its
# vector kernel (no per-shape cuDNN graph)? (sdpa_vector_probe.py)
set -euo pipefail
source tests/bench/gpu/device_env.sh
for d in 128 64; do python3 tests/bench/gpu/sdpa_vector_probe.py $d; done | tee $OUT/sdpa_probe.txt
