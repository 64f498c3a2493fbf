#!/usr/bin/env bash
# H200: the host's launch cost per step. A/B of plain decoding with the
# fused elementwise chains (model_kit::compiled) against MLX_DISABLE_COMPILE=1,
# and of MLX's CUDA graph size (MLX_MAX_OPS_PER_BUFFER: kernels per CUDA
# graph launch; MLX 0.32's default on compute capability 9.0 is 100); then the families against mlx-lm.
# Two calls (each under the device's 10 minutes): `device_launch.sh ab`, then
# `device_launch.sh vs`.
set -euo pipefail
case "${1:-}" in ab|vs) ;; *) echo "usage: device_launch.sh ab|vs" >&2; exit 2 ;; esac
source tests/bench/gpu/device_env.sh
qwen06b
family_shapes
ab() {  # model, then variants
  local m=$1; shift
  python3 tests/bench/bench_variants.py --host $H --plugins $P --gen 128 --reps 3 --model $m --prompt-ids $IDS "$@"
}
if [ "${1:-}" = ab ]; then
echo "## qwen3-0.6b shape"; ab /tmp/m/qwen3-0.6b --variant "fused=" --variant "not fused=env:MLX_DISABLE_COMPILE=1" \
  --variant "fused, 40 per graph=env:MLX_MAX_OPS_PER_BUFFER=40" --variant "fused, 80 per graph=env:MLX_MAX_OPS_PER_BUFFER=80" \
  --variant "fused, 160 per graph=env:MLX_MAX_OPS_PER_BUFFER=160" --variant "fused, 250 per graph=env:MLX_MAX_OPS_PER_BUFFER=250" | tee $OUT/qwen3.md
for f in gemma4-small gemma3-small; do
  echo "## $f"; ab /tmp/f/$f --variant "fused=" --variant "not fused=env:MLX_DISABLE_COMPILE=1" --variant "fused, 80 per graph=env:MLX_MAX_OPS_PER_BUFFER=80" \
    --variant "fused, 160 per graph=env:MLX_MAX_OPS_PER_BUFFER=160" | tee $OUT/$f.md
done
for n in 20 80 160; do
  echo "## step trace, $n per graph"
  MLX_MAX_OPS_PER_BUFFER=$n RUST_LOG=host_engine=trace $H generate --plugins $P --model /tmp/m/qwen3-0.6b --prompt-ids $IDS --max-tokens 64 --ignore-eos --json --warmup 2>$OUT/steps-$n.txt >/dev/null
  python3 tests/bench/traces.py $OUT/steps-$n.txt --target host_engine::step --event "plain step" --last 50 --stat mean --fields graph_ms,launch_ms
done
fi
if [ "${1:-}" = vs ]; then
echo "## qwen3_moe-small"; ab /tmp/f/qwen3_moe-small --variant "fused=" --variant "not fused=env:MLX_DISABLE_COMPILE=1" --variant "fused, 160 per graph=env:MLX_MAX_OPS_PER_BUFFER=160" | tee $OUT/qwen3_moe.md
echo "## families vs mlx-lm (defaults)"; python3 tests/bench/bench_generate.py --host $H --plugins $P --model /tmp/m/qwen3-0.6b --model /tmp/f/gemma4-small \
  --model /tmp/f/gemma3-small --model /tmp/f/qwen3_moe-small --model /tmp/f/qwen3_5-small --prompt-len 512 --gen 128 --reps 2 | tee $OUT/families.md
fi
