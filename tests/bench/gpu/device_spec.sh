#!/usr/bin/env bash
# H200: two-model speculation (self-draft, an agreeing 2-layer draft at two
# agreement levels, a random draft) and n-gram with the real default model,
# ours and mlx-lm side by side; then prefill of new prompt lengths with the
# unfused short-query attention limited to 16 query tokens (longer prompts
# go to MLX's sdpa) vs 2048 (the default). Four device calls: .gpu_a,
# .gpu_m1, .gpu_m2 (pack_smollm2_q4.sh), then .gpu_b + .devpack running this.
set -euo pipefail
source tests/bench/gpu/device_env.sh
python3 tests/bench/make_shape.py --out /tmp/m/qwen3-tiny --preset qwen3-tiny --tokenizer-from .device/tok
for e in 0.02 0.1; do
  python3 tests/bench/make_spec_pair.py --out /tmp/m/pair-$e --eps $e --tokenizer-from .device/tok | tee -a $OUT/pairs.json
done
echo "## two-model, 28-layer target (Qwen3-0.6B shape), eps 0.02"
python3 tests/bench/bench_spec.py --host $H --plugins $P --model /tmp/m/pair-0.02/target --gen 128 --k 3 \
  --draft "2-layer draft=/tmp/m/pair-0.02/draft" --draft "random qwen3-tiny=/tmp/m/qwen3-tiny" | tee $OUT/spec_pair_002.md
echo "## eps 0.1"
python3 tests/bench/bench_spec.py --host $H --plugins $P --model /tmp/m/pair-0.1/target --gen 128 --k 3 --no-self \
  --draft "2-layer draft=/tmp/m/pair-0.1/draft" | tee $OUT/spec_pair_01.md
smollm2_q4
echo "## n-gram, real model"
python3 tests/bench/bench_ngram.py --host $H --plugins $P --model /tmp/smollm2-q4 --gen 256 | tee $OUT/ngram_real.md
echo "## prefill of a new prompt length (tok/s), unfused attention up to 16 vs 2048 query tokens"
for L in 100 500 1000 2000; do
  IDS=$(ids $L $L)
  for lim in 16 2048; do
    r=$($H generate --plugins $P --model /tmp/m/pair-0.02/target --prompt-ids $IDS --max-tokens 4 --ignore-eos --json --warmup \
      --model-option attention-unfused-max=$lim | python3 -c "import json,sys; print(round(json.load(sys.stdin)['prefill_tokens_per_s'],1))")
    echo "| $L | unfused<=$lim | $r |"
  done
done | tee $OUT/prefill.md
