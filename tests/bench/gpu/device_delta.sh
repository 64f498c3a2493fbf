#!/usr/bin/env bash
# H200: the gated DeltaNet kernel (model-qwen3-5's delta_kernel) against the
# ops route it replaces on the GPU (`--model-option delta=ops`, mlx-lm's
# route), in one lease. `device_delta.sh tiny` runs the tiny parity only;
# `device_delta.sh` all of it, after device_drafters.sh made
# /tmp/d/qwen3_5-8b (the Qwen3.5 hybrid at the 8B scale, random weights).
# TINY is a tiny qwen3_5 bf16 folder carried with the call (default
# models/tiny/tiny-qwen3_5-bf16, made by `cargo xtask build`).
#   1. parity: greedy 64 tokens and last-prompt logits on TINY against
#      mlx-lm (oracle.py), both routes; the kernel against the ops route on
#      the 8B-scale hybrid; batched rows of different lengths (padding
#      masks) against serial (batch_parity.py), both routes.
#   2. speed: `host bench` prefill and decode at batch 1 and 8, both routes,
#      and mlx_lm.benchmark at batch 1 (mlx-lm runs the ops route on CUDA).
TINY=${TINY:-models/tiny/tiny-qwen3_5-bf16}
set -euo pipefail
source tests/bench/gpu/device_env.sh
route_args() { [ $1 = kernel ] || echo "--model-option delta=ops"; }
HY=/tmp/d/qwen3_5-8b
LONG=$(ids 1 300)
{
  echo "## parity"
  python3 models/scripts/oracle.py --model $TINY --prompt-ids $LONG --max-tokens 64 --out /tmp/tiny.ref.json > /dev/null
  for route in kernel ops; do
    ra=$(route_args $route)
    $H generate --plugins $P --model $TINY --prompt-ids $LONG --max-tokens 64 --ignore-eos --dtype native --json $ra > /tmp/tiny.$route.json
    $H logits --plugins $P --model $TINY --prompt-ids $LONG --dtype native $ra > /tmp/tiny.$route.logits.json
    [ "${1:-}" = tiny ] && continue
    $H generate --plugins $P --model $HY --prompt-ids $LONG --max-tokens 64 --ignore-eos --json $ra > /tmp/hy.$route.json
    $H logits --plugins $P --model $HY --prompt-ids $LONG $ra > /tmp/hy.$route.logits.json
  done
  python3 - "${1:-all}" <<'PY'
import json, sys
L = lambda p: json.load(open(p))
def cmp(name, a, b, ta, tb):
    diff = max(abs(x - y) for x, y in zip(a, b))
    first = next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), None)
    print(f"| {name} | {'identical' if first is None else f'diverge at {first}'} | {diff:.4f} |")
print("| comparison | greedy 64 tokens after 300 | max logit diff (last prompt position) |")
print("|---|---|---|")
ref = L("/tmp/tiny.ref.json")
for route in ("kernel", "ops"):
    cmp(f"tiny qwen3_5 bf16, {route} vs mlx-lm", L(f"/tmp/tiny.{route}.logits.json")["logits"], ref["prompt_last_logits"],
        L(f"/tmp/tiny.{route}.json")["tokens"], ref["tokens"])
if sys.argv[1] != "tiny":
  cmp("qwen3_5-8b shape, kernel vs ops", L("/tmp/hy.kernel.logits.json")["logits"], L("/tmp/hy.ops.logits.json")["logits"],
    L("/tmp/hy.kernel.json")["tokens"], L("/tmp/hy.ops.json")["tokens"])
PY
  for route in kernel ops; do
    extra=$(route_args $route)
    echo "batched (left-padded rows) vs serial, $route route, tiny: $(python3 tests/bench/batch_parity.py --host $H --plugins $P --model $TINY --clients 8 --max-tokens 32 --extra="$extra" | tail -1)"
    [ "${1:-}" = tiny ] && continue
    echo "batched vs serial, $route route, 8B-scale hybrid: $(python3 tests/bench/batch_parity.py --host $H --plugins $P --model $HY --clients 8 --max-tokens 32 --extra="$extra" | tail -1)"
  done
  [ "${1:-}" = tiny ] && exit 0
  echo "## speed: host bench --model $HY --batch 1,8 --trials 1"
  for L in 512 4096; do
    for route in kernel ops; do
      echo "### prompt $L, $route"
      $H bench --plugins $P --model $HY --prompt-len $L --gen-len 64 --batch 1,8 --trials 1 $(route_args $route) 2>/dev/null
    done
    echo "### prompt $L, mlx_lm.benchmark -b 1"
    python3 -m mlx_lm.benchmark --model $HY -p $L -g 64 -b 1 -n 1 2>&1 | grep -v Warning | tail -3
  done
} 2>&1 | tee $OUT/delta.md
