#!/usr/bin/env bash
# H200: native bf16 parity of the MoE families (MLX's CPU gather_mm is
# float32-only, so neither engine can run them natively on the CPU): greedy
# 64 tokens and last-prompt logits, ours vs mlx-lm, on the tiny bf16 MoE
# folders copied to /tmp/tiny by an earlier device call (.gpu_tiny).
set -euo pipefail
[ -d .device ] || tar -xJf .devpack/device.tar.xz
source tests/bench/device_env.sh
for m in tiny-qwen3_moe-bf16 tiny-qwen3_5_moe-bf16 tiny-gemma4-moe-bf16; do
  d=/tmp/tiny/$m
  python3 models/scripts/oracle.py --model $d --prompt-ids 1,2,3,4,5 --max-tokens 64 --out /tmp/$m.ref.json > /dev/null
  $H generate --plugins $P --model $d --prompt-ids 1,2,3,4,5 --max-tokens 64 --ignore-eos --dtype native --json > /tmp/$m.ours.json
  $H logits --plugins $P --model $d --prompt-ids 1,2,3,4,5 --dtype native > /tmp/$m.logits.json
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
done | tee $OUT/bf16_moe.md
