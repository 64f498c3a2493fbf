#!/usr/bin/env bash
# H200: native bf16 parity on the GPU (the MoE families cannot run bf16
# natively on the CPU: MLX's CPU gather_mm is float32-only; the fused
# elementwise kernels round differently there than on the CPU): greedy 64
# tokens and last-prompt logits, ours vs mlx-lm (models/scripts/oracle.py).
# Usage: [OURS_ARGS="--gpu-attention mlx"] device_bf16_parity.sh DIR NAME...
# (tiny folders under DIR, e.g. /tmp/tiny copied by an earlier call, or
# models/tiny carried with the call). OURS_ARGS go to our `host generate`
# and `host logits` only (e.g. `--gpu-attention mlx`, `--model-option
# attention-per-query-max=0`); MLX's own switches (MLX_DISABLE_COMPILE=1)
# set in the environment reach both engines.
set -euo pipefail
source tests/bench/gpu/device_env.sh
read -r -a ours_args <<< "${OURS_ARGS:-}"
dir=$1; shift
for m in "$@"; do
  d=$dir/$m
  python3 models/scripts/oracle.py --model $d --prompt-ids 1,2,3,4,5 --max-tokens 64 --out /tmp/$m.ref.json > /dev/null
  $H generate --plugins $P --model $d --prompt-ids 1,2,3,4,5 --max-tokens 64 --ignore-eos --dtype native --json "${ours_args[@]}" > /tmp/$m.ours.json
  $H logits --plugins $P --model $d --prompt-ids 1,2,3,4,5 --dtype native "${ours_args[@]}" > /tmp/$m.logits.json
  python3 - "$m" <<'PY'
import json, sys
m = sys.argv[1]
ref, ours, lg = (json.load(open(f"/tmp/{m}.{k}.json")) for k in ("ref", "ours", "logits"))
a, b = lg["logits"], ref["prompt_last_logits"]
worst = max(abs(x - y) - (0.05 + 0.02 * abs(y)) for x, y in zip(a, b))
diff = max(abs(x - y) for x, y in zip(a, b))
same = ours["tokens"] == ref["tokens"]
first = next((i for i, (x, y) in enumerate(zip(ours["tokens"], ref["tokens"])) if x != y), None)
print(f"| {m} | {'identical' if same else f'diverge at {first}'} (64 tokens) | {diff:.4f} | {'within' if worst <= 0 else 'OUTSIDE'} 0.05 + 0.02|b| |")
PY
done | tee $OUT/bf16_parity.md
