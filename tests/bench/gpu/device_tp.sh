#!/usr/bin/env bash
# Tensor parallelism on two H200s (nvidia-h200-x2; second and later device
# calls: .gpu_a first, then .gpu_b + .devpack running this), Qwen3-8B shape
# bf16 (random weights), `--tp 1` against `--tp 2` over NCCL.
# `device_tp.sh nccl`: MLX's NCCL all_sum between two processes, alone
# (the cost of one decode activation's sum).
# `device_tp.sh generate`: batch-1 decode, `host generate`, 256 tokens.
# `device_tp.sh http`: `host serve --batch 32` at 1 and 32 clients
# (bench_http.py), `--tp 1` then `--tp 2`.
set -euo pipefail
case "${1:-}" in nccl|generate|http) ;; *) echo "usage: device_tp.sh nccl|generate|http" >&2; exit 2 ;; esac
source tests/bench/gpu/device_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
if [ "$1" = nccl ]; then
  python3 tests/bench/gpu/nccl_all_sum.py 2 | tee $OUT/tp_nccl.md
  exit 0
fi
M=/tmp/m/qwen3-8b
[ -d $M ] || python3 tests/bench/make_shape.py --out $M --preset qwen3-8b --tokenizer-from .device/tok > /dev/null
if [ "$1" = generate ]; then
  for tp in 1 2 1 2; do
    echo "## host generate --tp $tp"
    $H generate --plugins $P --model $M --prompt-ids $IDS --max-tokens 256 --ignore-eos --json --tp $tp \
      | python3 -c "import json,sys; r=json.loads(sys.stdin.read()); print({k: r[k] for k in ('prefill_tokens_per_s','decode_tokens_per_s') if k in r})"
  done | tee $OUT/tp_generate.md
else
  bench() { python3 tests/bench/bench_http.py --host $H --plugins $P --max-tokens 128 --per-client 2 --servers ours "$@"; }
  for tp in 1 2; do
    echo "## qwen3-8b shape, --tp $tp --batch 32"
    bench --model $M --concurrency 1,32 --extra="--batch 32 --tp $tp" --json $OUT/tp_http_$tp.json
  done | tee $OUT/tp_http.md
fi
