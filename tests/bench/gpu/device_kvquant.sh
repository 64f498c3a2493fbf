#!/usr/bin/env bash
# KV schemes on the H200 (second of two device calls: .gpu_a first, then
# .gpu_b + .devpack running this), Qwen3-0.6B shape bf16 (random weights):
# at a 4096-token prompt the rows' K/V outweigh the weights from a few rows
# up, so decode reads mostly K/V. `host bench` per scheme at batch 1, 8 and
# 32; mlx-lm's own quantized cache (stream_generate kv_bits, batch 1) on the
# same folder and libmlx for comparison (where it runs: its failure is printed).
set -euo pipefail
source tests/bench/gpu/device_env.sh
qwen06b
for q in off 8 4 turbo; do
  echo "## host bench --kv-quant $q"
  $H bench --plugins $P --model /tmp/m/qwen3-0.6b --prompt-len 4096 --gen-len 128 --batch 1,8,32 --trials 2 --kv-quant $q
done | tee $OUT/kvquant_host.md
python3 - <<'PY' | tee $OUT/kvquant_mlx_lm.md
import random, mlx.core as mx
from mlx_lm import load, stream_generate
model, tok = load("/tmp/m/qwen3-0.6b")
rng = random.Random(0)
ids = [rng.randrange(100, 49000) for _ in range(4096)]
for bits in (None, 8, 4):
    for trial in range(2):
        try:
            last = None
            for r in stream_generate(model, tok, ids, max_tokens=128, kv_bits=bits, kv_group_size=64, quantized_kv_start=0):
                last = r
            print(f"mlx_lm kv_bits={bits} trial {trial}: prefill {last.prompt_tps:.1f} tok/s, decode {last.generation_tps:.1f} tok/s, peak {last.peak_memory:.2f} GB")
        except RuntimeError as e:  # MLX's CUDA backend: no quantized matmul for in-place codes
            print(f"mlx_lm kv_bits={bits}: fails: {e}")
            break
PY
