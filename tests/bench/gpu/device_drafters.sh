#!/usr/bin/env bash
# Speculative rounds of the target-state drafters on the H200 (second of two
# device calls: .gpu_a first, then .gpu_b + .devpack running this), at the
# Qwen3-8B scale with random weights (make_drafter_shapes.py; the assistant
# over a Gemma 4 target of that scale, make_assistant_shape.py): targets that
# repeat their input, drafters that are always rejected (`-rand`: the cost of
# a round in target steps) or always accepted (`-agree`: the speedup at full
# acceptance). `host generate`, 256 tokens after a 64-token prompt, bf16.
# TARGETS picks targets (default all three); ALT_ARGS adds rows run with
# these `host generate` arguments too (e.g. "--model-option delta=ops").
set -euo pipefail
source tests/bench/gpu/device_env.sh
TARGETS=${TARGETS:-qwen3-8b qwen3_5-8b gemma4-8b}
for t in $TARGETS; do
  [ -d /tmp/d/$t ] && continue
  case $t in
    gemma4-8b) python3 tests/bench/make_assistant_shape.py --out /tmp/d --tokenizer-from .device/tok > /dev/null ;;
    *) drafter_shape ${t%-8b} ;;
  esac
done
gen() { $H generate --plugins $P --model "$1" --prompt-ids $IDS --max-tokens 256 --ignore-eos --json --warmup "${@:2}" 2>/dev/null | tail -1; }
row() {
  python3 -c "
import json, sys
plain, spec = json.loads(sys.argv[1]), json.loads(sys.argv[2])
p, s = plain['decode_tokens_per_s'], spec['decode_tokens_per_s']
sp = spec['speculation']
tokens_per_round = (sp['accepted'] + sp['rounds']) / max(sp['rounds'], 1)
cost = tokens_per_round * p / s  # one round's time in plain steps
print(f\"| {sys.argv[3]} | {p:.1f} | {s:.1f} | {sp['drafted'] / max(sp['rounds'], 1):.1f} | {sp['acceptance']:.2f} | {cost:.2f} | {s / p:.2f}x |\")
" "$1" "$2" "$3"
}
echo "| target + drafter | plain tok/s | speculative tok/s | drafts/round | acceptance | round cost (target steps) | speedup |"
echo "|---|---|---|---|---|---|---|"
variants=("")
[ -z "${ALT_ARGS:-}" ] || variants+=("$ALT_ARGS")
for alt in "${variants[@]}"; do
  read -r -a alt_args <<< "$alt"
  tag=${alt:+ [$alt]}
  for t in $TARGETS; do
    plain=$(gen /tmp/d/$t "${alt_args[@]}")
    for d in /tmp/d/$t/*-rand /tmp/d/$t/*-agree; do
      [ -d "$d" ] || continue
      for depth in "" "--num-draft-tokens 2"; do
        [[ $d == *dflash* || $d == *dspark* || $d == *deepspec* || -z $depth ]] || continue
        spec=$(gen /tmp/d/$t --draft-model $d --speculate-always $depth "${alt_args[@]}")
        row "$plain" "$spec" "$t + $(basename $d)${depth:+ ($depth)}$tag"
      done
    done
  done
done | tee $OUT/drafters.md
