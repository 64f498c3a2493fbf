#!/usr/bin/env bash
# Runs `host generate` N times and counts the runs that did not end cleanly:
# a non-zero status, a signal (the core file is kept with gdb's backtraces of
# it), or a hang: still running EXIT_LIMIT seconds (default 30) after the
# summary line (generation done), or RUN_LIMIT seconds (default 600) after
# the start; every thread's backtrace is taken with gdb before the process is
# killed. tests/it/exit_stress.rs runs the short version of this loop.
#
#   tests/bench/stress_exit.sh [N] [eos|length] [HOST] [PLUGINS]
#
# eos (default): `--chat Hi --max-tokens 64 --warmup`, which stops at EOS with
# a forward pass still queued on MLX's stream thread; length: the
# `--prompt Hello --max-tokens 8 --warmup` run, which stops at max-tokens.
# Output and backtraces of failed runs stay in $OUT (default
# target/stress-exit); the last line is `runs N, clean C, failed F (...)`.
set -uo pipefail
cd "$(dirname "$0")/../.."
N=${1:-100}
MODE=${2:-eos}
HOST=$(realpath "${3:-target/release/host}")
PLUGINS=$(realpath "${4:-plugins}")
MODEL=$(realpath "${MODEL:-models/smollm2-135m-instruct}")
EXIT_LIMIT=${EXIT_LIMIT:-30}
RUN_LIMIT=${RUN_LIMIT:-600}
OUT=${OUT:-target/stress-exit}
case $MODE in
  eos) ARGS=(--chat Hi --max-tokens 64 --warmup) ;;
  length) ARGS=(--prompt Hello --max-tokens 8 --warmup) ;;
  *) echo "mode is eos or length, not $MODE" >&2; exit 2 ;;
esac
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
rm -f "$OUT"/run.* "$OUT"/core*
ulimit -c unlimited
clean=0; signalled=0; failed=0; hung=0
for i in $(seq 1 "$N"); do
  # A core lands in the process's working folder.
  (cd "$OUT" && exec "$HOST" generate --plugins "$PLUGINS" --model "$MODEL" "${ARGS[@]}") \
    >"$OUT/run.$i.out" 2>"$OUT/run.$i.err" &
  pid=$!
  start=$SECONDS; done_at=
  while kill -0 $pid 2>/dev/null; do
    if [ -z "$done_at" ] && grep -qs ' generated (' "$OUT/run.$i.err"; then done_at=$SECONDS; fi
    if [ -n "$done_at" ] && [ $((SECONDS - done_at)) -ge "$EXIT_LIMIT" ]; then why="at exit"; break; fi
    if [ $((SECONDS - start)) -ge "$RUN_LIMIT" ]; then why="before finishing"; break; fi
    sleep 0.1
  done
  if kill -0 $pid 2>/dev/null; then
    gdb -q -batch -p $pid -ex "thread apply all bt 20" >"$OUT/run.$i.hang" 2>&1
    kill -9 $pid; wait $pid 2>/dev/null
    hung=$((hung + 1)); echo "run $i: hung $why (backtraces in $OUT/run.$i.hang)"
    continue
  fi
  wait $pid; rc=$?
  if [ $rc -eq 0 ]; then
    clean=$((clean + 1)); rm -f "$OUT/run.$i.out" "$OUT/run.$i.err"
  elif [ $rc -gt 128 ]; then
    signalled=$((signalled + 1)); echo "run $i: signal $((rc - 128))"
    if [ -f "$OUT/core" ]; then
      mv "$OUT/core" "$OUT/core.$i"
      gdb -q -batch -ex "thread apply all bt 30" "$HOST" "$OUT/core.$i" >"$OUT/run.$i.bt" 2>&1
      echo "  backtraces: $OUT/run.$i.bt"
    fi
  else
    failed=$((failed + 1)); echo "run $i: exit status $rc ($OUT/run.$i.err)"
  fi
done
echo "runs $N, clean $clean, failed $((signalled + failed + hung)) (signal $signalled, error $failed, hang $hung)"
[ $clean -eq "$N" ]
