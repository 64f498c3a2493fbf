#!/usr/bin/env bash
# Paged K/V on the H200 (second of two device calls: .gpu_a first, then
# .gpu_b + .devpack running this), Qwen3-0.6B shape bf16 (random weights):
# `host bench` at batch 1, 8 and 32 over a 4096-token prompt per row, plain
# K/V against `--paged-kv` (blocks of 16 and 64), so the cost of gathering
# each row's blocks per layer and step shows where K/V traffic dominates;
# first, greedy output with `--paged-kv` against plain K/V's for 8 rows of
# one length (must be equal: the GPU's gather kernel copies the same K/V)
# and of different lengths (paged_parity.py); then rows of different
# lengths (--ragged), plain against paged.
set -euo pipefail
source tests/bench/gpu/device_env.sh
qwen06b
for rows in --even ""; do
  (cd tests/bench && python3 paged_parity.py --host ../../$H --plugins ../../$P --model /tmp/m/qwen3-0.6b --clients 8 --max-tokens 64 $rows || true)
done | tee $OUT/paged_parity.txt
for kv in "" "--paged-kv" "--paged-kv --kv-block-size 64"; do
  echo "## host bench ${kv:-(plain K/V)}"
  $H bench --plugins $P --model /tmp/m/qwen3-0.6b --prompt-len 4096 --gen-len 128 --batch 1,8,32 --trials 2 $kv
done | tee $OUT/paged_host.md
# Rows of different lengths (--ragged): on the GPU kv-paged's decode steps
# then attend out of the pool through the block table, no view gathered.
for kv in "" "--paged-kv"; do
  echo "## host bench --ragged ${kv:-(plain K/V)}"
  $H bench --plugins $P --model /tmp/m/qwen3-0.6b --prompt-len 4096 --gen-len 128 --batch 8,32 --trials 2 --ragged $kv
done | tee $OUT/paged_ragged.md
