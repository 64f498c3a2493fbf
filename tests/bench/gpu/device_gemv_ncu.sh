#!/usr/bin/env bash
# H200: every split of the fused decode projections' work (gemv_probe.py
# --ncu-log) at the Qwen3-8B layer's and LM head's shapes, each kernel's own
# duration from Nsight Compute, the fastest per case beside the engine's
# (`gemv::split`) and MLX's matmul for the LM head. Second of two device
# calls (.devpack not needed). CASES="down + residual,lm head" limits it.
set -euo pipefail
source tests/bench/gpu/device_env.sh
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
MLX_USE_CUDA_GRAPHS=0 timeout 450 $NCU --clock-control none --metrics gpu__time_duration.sum --csv \
  -k 'regex:probe|gemv|gemm|Gemm|cutlass|xmma' python3 tests/bench/gpu/gemv_probe.py --ncu-log /tmp/ncu_log.json ${CASES:+--cases "$CASES"} \
  > $OUT/ncu_probe.csv 2> $OUT/ncu.err || { echo "ncu failed"; tail -20 $OUT/ncu.err; }
python3 tests/bench/gpu/gemv_probe.py --parse $OUT/ncu_probe.csv /tmp/ncu_log.json --top 5 | tee $OUT/ncu_sweep.md
