#!/usr/bin/env bash
# H200: prefill of prompt lengths new to the process (host generate --warmup
# warms up on a longer prompt), fused attention (cuDNN) vs the unfused
# short-query path up to 16 (the default) / 2048 query tokens; 3 runs each.
set -euo pipefail
source tests/bench/device_env.sh
qwen06b
echo "| prompt tokens | unfused up to | prefill tok/s, 3 runs |"
echo "|---|---|---|"
for L in 100 500 1000 2000 4000; do
  IDS=$(python3 -c "import random; r=random.Random($L); print(','.join(str(r.randrange(100,49000)) for _ in range($L)))")
  for lim in 16 2048; do
    rs=""
    for rep in 1 2 3; do
      rs="$rs $(MLX_ENGINE_UNFUSED_MAX=$lim $H generate --plugins $P --model /tmp/m/qwen3-0.6b --prompt-ids $IDS --max-tokens 2 --ignore-eos --json --warmup | python3 -c "import json,sys; print(round(json.load(sys.stdin)['prefill_tokens_per_s']))")"
    done
    echo "| $L | $lim |$rs |"
  done
done | tee $OUT/prefill.md
