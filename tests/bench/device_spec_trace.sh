#!/usr/bin/env bash
# H200 diagnosis: where a speculative round's time goes (HOST_SPEC_TRACE),
# what a forward costs per verify width and per new prompt length in mlx-lm
# itself, fused vs unfused attention (width_cost.py).
set -euo pipefail
[ -d .device ] || tar -xJf .devpack/device.tar.xz
source tests/bench/device_env.sh
python3 tests/bench/make_spec_pair.py --out /tmp/m/pair --eps 0.02 --tokenizer-from .device/tok --check-tokens 4
IDS=$(python3 -c "import random; r=random.Random(0); print(','.join(str(r.randrange(100,49000)) for _ in range(64)))")
run() { local name=$1; shift; HOST_SPEC_TRACE=1 $H generate --plugins $P --model /tmp/m/pair/target --prompt-ids $IDS --max-tokens 96 --ignore-eos --json "$@" 2>$OUT/trace_$name.txt | python3 -c "import json,sys; d=json.load(sys.stdin); print('decode', round(d['decode_tokens_per_s'],1), 'prefill_tps', round(d['prefill_tokens_per_s'],1), (d.get('speculation') or {}).get('acceptance'), (d.get('speculation') or {}).get('disabled'))"; }
for lim in 1 16; do
  export MLX_ENGINE_UNFUSED_MAX=$lim; echo "### unfused up to $lim (no warmup: every shape new)"
  echo plain; run plain-$lim
  echo pair-k3; run pair-k3-$lim --draft-model /tmp/m/pair/draft --num-draft-tokens 3
  echo self-k3; run self-k3-$lim --draft-model /tmp/m/pair/target --num-draft-tokens 3
  echo ngram-k4; run ngram-k4-$lim --draft-kind ngram --num-draft-tokens 4
done
unset MLX_ENGINE_UNFUSED_MAX
python3 tests/bench/width_cost.py /tmp/m/pair/target | tee $OUT/width_cost.txt
for f in $OUT/trace_*-16.txt; do echo "== $f"; grep spec-trace $f | head -8; done
