#!/usr/bin/env bash
# H200: where a warm prefill spends its wall time, ours against mlx-lm's,
# stage by stage on a CUDA timeline (cupti_trace.c, read by timeline.py):
# each prefill chunk and the first token's step, the GPU's busy time in it,
# and the host API calls under its idle gaps. Each run is a fresh process
# that first runs its prompt cycled 18 tokens longer (`host generate
# --warmup`; the same for mlx-lm), so the timed prompt meets shapes new to
# the process, as a server does. Runs go in the order given, so that what
# one process leaves in the machine's caches (the driver's JIT cache) can be
# told apart: `ours:L` and `mlxlm:L` prefill L tokens, `decode` times
# batch-1 decode steps. Second of two device calls (.gpu_b + .devpack).
#   device_prefill_timeline.sh qwen3-8b ours:4096 mlxlm:4096 decode
set -euo pipefail
source tests/bench/gpu/device_env.sh
SHAPE=$1; shift
shape $SHAPE
source tests/bench/gpu/build_cupti_trace.sh
export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$CUPTI_LIB"

n=0
for run in "$@"; do
  n=$((n + 1)); side=${run%%:*}; L=${run#*:}; name="$n-$side-$L"
  case $side in
    ours)
      RUST_LOG=host_engine::step=trace trace $name \
        $H generate --plugins $P --model /tmp/m/$SHAPE --prompt-ids "$(ids $L $L)" --max-tokens 2 --ignore-eos --json --warmup \
        > $OUT/$name.json 2> $OUT/$name.log
      echo "## $name: ours, $L-token prefill ($(grep -o '"prefill_tokens_per_s":[0-9.]*' $OUT/$name.json))"
      python3 tests/bench/gpu/timeline.py $OUT/$name.csv --rust-log $OUT/$name.log --after "tokens=2048" --back 1 --gaps 2 ;;
    mlxlm)
      trace $name python3 -c "
import random, sys, time
import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import generate_step
m, _ = load('/tmp/m/$SHAPE')
r = random.Random($L); ids = [r.randrange(100, 49000) for _ in range($L)]
for _ in generate_step(mx.array((ids * 2)[: len(ids) + 18]), m, max_tokens=2): pass
mark = lambda label: print(label, time.time_ns(), file=sys.stderr, flush=True)
mark('timed start')
t0 = time.perf_counter()
for _ in generate_step(mx.array(ids), m, max_tokens=1,
                       prompt_progress_callback=lambda done, total: mark(f'prompt {done}/{total}')):
    break
print(f'{len(ids) / (time.perf_counter() - t0):.0f}')
" > $OUT/$name.txt 2> $OUT/$name.markers
      echo "## $name: mlx-lm, $L-token prefill ($(cat $OUT/$name.txt) tok/s)"
      python3 tests/bench/gpu/timeline.py $OUT/$name.csv --gaps 2 \
        --markers <(grep -E '^(timed start|prompt) ' $OUT/$name.markers) --after "timed start" ;;
    decode)
      RUST_LOG=host_engine::step=trace trace $name \
        $H generate --plugins $P --model /tmp/m/$SHAPE --prompt-ids "$(ids 0 32)" --max-tokens 128 --ignore-eos --json --warmup \
        > $OUT/$name.json 2> $OUT/$name.log
      echo "## $name: ours, batch-1 decode, the last 40 steps"
      python3 tests/bench/gpu/timeline.py $OUT/$name.csv --rust-log $OUT/$name.log --last 40 | tail -3
      rm -f $OUT/$name.csv ;;
  esac
done 2>&1 | tee $OUT/prefill_timeline.md
