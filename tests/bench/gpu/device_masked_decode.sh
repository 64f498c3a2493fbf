#!/usr/bin/env bash
# Masked decode steps on the H200 (second of two device calls: .gpu_a first,
# then .gpu_b + .devpack running this): rows of different lengths decode
# under a padding mask, which MLX's fused kernels refuse
# (model_kit::decode_attention). Greedy output of a left-padded batch
# against each request alone (batch_parity.py, Qwen3-0.6B shape), then
# `host bench` on the Qwen3-8B shape with equal prompts and --ragged ones.
# `device_masked_decode.sh http`: the 8B shape through HTTP at 1 and 32
# clients with the batch scheduler's step trace.
set -euo pipefail
source tests/bench/gpu/device_env.sh
shape qwen3-8b
if [ "${1:-}" = http ]; then
  RUST_LOG=host_engine::batch=trace python3 tests/bench/bench_http.py --host $H --plugins $P --model /tmp/m/qwen3-8b --max-tokens 128 --per-client 2 \
    --concurrency 1,32 --servers ours --extra="--batch 32" --server-log /tmp/trace | tee $OUT/http_8b.md
  python3 tests/bench/traces.py /tmp/trace.ours --target host_engine::batch --event "batched plain step" --stat mean \
    --fields rows,build_ms,wait_ms,ms | tee -a $OUT/http_8b.md
  exit 0
fi
qwen06b
(cd tests/bench && python3 batch_parity.py --host ../../$H --plugins ../../$P --model /tmp/m/qwen3-0.6b --clients 8 --max-tokens 64 || true) | tee $OUT/batch_parity.txt
for rows in "" --ragged; do
  echo "## host bench ${rows:-(equal prompts)}"
  $H bench --plugins $P --model /tmp/m/qwen3-8b --prompt-len 512 --gen-len 128 --batch ${BATCHES:-1,8,32} --trials 2 $rows
done | tee $OUT/masked_bench.md
