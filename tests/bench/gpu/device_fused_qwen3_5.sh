#!/usr/bin/env bash
# H200: the Qwen3.5 hybrid's decode step and MTP round with its projections
# fused with their norms and residuals (model_kit::fused_layers), for each
# plugin folder in $PLUGINS (default $P; two folders make an A/B in one
# lease), at make_drafter_shapes.py's 8B-like shape: plain greedy decode and
# MTP with the agreeing head (2 drafts), the step and round traces, and
# whether MTP's tokens equal plain decoding's; then bf16 greedy parity with
# mlx-lm on the small hybrid shape (device_bf16_parity.sh).
set -euo pipefail
source tests/bench/gpu/device_env.sh
PLUGINS=${PLUGINS:-$P}
drafter_shape qwen3_5
for p in $PLUGINS; do
  n=$(basename $p)
  G="$H generate --plugins $p --model /tmp/d/qwen3_5-8b --prompt-ids $IDS --max-tokens 256 --ignore-eos --json --warmup"
  RUST_LOG=host_engine::step=trace $G 2> $OUT/plain_$n.log > $OUT/plain_$n.json
  RUST_LOG=host_engine::spec=trace $G --draft-model /tmp/d/qwen3_5-8b/mtp-agree --speculate-always 2> $OUT/mtp_$n.log > $OUT/mtp_$n.json
  python3 - $OUT/plain_$n.json $OUT/mtp_$n.json $n <<'PY'
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
s = b.get("speculation") or {}
print(f"| {sys.argv[3]} | plain {a['decode_tokens_per_s']:.1f} tok/s | MTP {b['decode_tokens_per_s']:.1f} tok/s | acceptance {s.get('acceptance')} | MTP tokens equal plain: {a['tokens'] == b['tokens']} |")
PY
  python3 tests/bench/traces.py $OUT/plain_$n.log --target host_engine::step --event "plain step" --last 100
  python3 tests/bench/traces.py $OUT/mtp_$n.log --target host_engine::spec --event "speculative round" --last 60 --fields draft_ms,build_ms,launch_ms,wait_ms,accepted
done 2>&1 | tee $OUT/fused_qwen3_5.md
[ -d /tmp/f/qwen3_5-small ] || python3 tests/bench/make_family_shape.py --out /tmp/f --shapes qwen3_5-small --tokenizer-from .device/tok > /dev/null
bash tests/bench/gpu/device_bf16_parity.sh /tmp/f qwen3_5-small 2>&1 | grep -v "already exists"
