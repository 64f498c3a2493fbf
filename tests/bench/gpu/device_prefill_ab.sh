#!/usr/bin/env bash
# H200: prefill of prompt lengths new to the process, this build against
# another one (its pack, from pack_device.sh, at .devpack_b/device.tar.xz),
# alternating fresh `host generate --warmup` processes, REPS rounds per
# length; each line gives prefill tok/s and a digest of the greedy tokens
# (equal digests: equal output). Then `bench_generate.py` of this build
# against mlx-lm at the first length. Second of two device calls (.gpu_b +
# .devpack + .devpack_b). `device_prefill_ab.sh qwen3-8b 3 4096 3000`
set -euo pipefail
source tests/bench/gpu/device_env.sh
SHAPE=$1; REPS=$2; shift 2
shape $SHAPE
other_build
for L in "$@"; do
  IDS=$(ids $L $L)
  for r in $(seq $REPS); do
    for side in other this; do
      side_build $side
      $BIN generate --plugins $PL --model /tmp/m/$SHAPE --prompt-ids $IDS --max-tokens 8 --ignore-eos --json --warmup \
        | python3 -c "import json,sys,hashlib; d=json.load(sys.stdin); print(f'L=$L round $r $side: prefill {d[\"prefill_tokens_per_s\"]:.0f} tok/s, tokens {hashlib.sha1(str(d[\"tokens\"]).encode()).hexdigest()[:10]}')"
    done
  done
done
python3 tests/bench/bench_generate.py --host $H --plugins $P --model /tmp/m/$SHAPE --prompt-len $1 --gen 16 --reps 2
