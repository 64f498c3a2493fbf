# Sourced by every script in tests/bench/gpu (run from the repository root on
# the GPU machine): unpacks .device (pack_device.sh), joins and installs the
# CUDA MLX wheel carried in two halves plus the mlx and mlx-lm wheels in
# .gpu_b, and points the loader at them (tests/bench/README.md, "GPU runs").
[ -d .device ] || [ ! -f .devpack/device.tar.xz ] || tar -xJf .devpack/device.tar.xz   # .device travels compressed (size limit per call)
cat /tmp/mlxparts/part_aa .gpu_b/part_ab > /tmp/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl
python3 -m pip install -q --no-index --no-deps --target /tmp/site /tmp/mlx_cuda_13-*.whl .gpu_b/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
NV=$(python3 -c "import nvidia,os,glob; print(':'.join(sorted(glob.glob(os.path.join(list(nvidia.__path__)[0],'*','lib')))))")
export LD_LIBRARY_PATH="/tmp/site/mlx/lib:$PWD/.device/lib:$NV"
H=.device/host; P=.device/plugins
# The speculation scripts' shared inputs: the agreeing 28-layer target /
# 2-layer draft pair at agreement knob $1 (make_spec_pair.py), and 64
# random prompt ids.
pair() { [ -d /tmp/m/pair-$1 ] || python3 tests/bench/make_spec_pair.py --out /tmp/m/pair-$1 --eps $1 --tokenizer-from .device/tok > /dev/null; }
# `ids SEED N`: N random prompt token ids, comma-separated, the same for a
# given seed on every machine.
ids() { python3 -c "import random; r=random.Random($1); print(','.join(str(r.randrange(100,49000)) for _ in range($2)))"; }
IDS=$(ids 0 64)
# Random-weight benchmark folders, made once per machine: a make_shape.py
# preset at /tmp/m/PRESET (`shape qwen3-8b`), the Qwen3-0.6B shape
# (/tmp/m/qwen3-0.6b) and the families at a small shape (/tmp/f/*).
shape() { [ -d /tmp/m/$1 ] || python3 tests/bench/make_shape.py --out /tmp/m/$1 --preset $1 --tokenizer-from .device/tok > /dev/null; }
qwen06b() { shape qwen3-0.6b; }
family_shapes() { [ -d /tmp/f/qwen3_5-small ] || python3 tests/bench/make_family_shape.py --out /tmp/f --tokenizer-from .device/tok > /dev/null; }
# `drafter_shape T`: make_drafter_shapes.py's 8B-scale target T (qwen3,
# qwen3_5) and its drafters at /tmp/d/T-8b, made once per machine.
drafter_shape() { [ -d /tmp/d/$1-8b ] || python3 tests/bench/make_drafter_shapes.py --out /tmp/d --only $1 --tokenizer-from .device/tok > /dev/null; }
# The A/B scripts' other build: `other_build` unpacks its pack
# (.devpack_b/device.tar.xz); `side_build this|other` sets BIN and PL
# to that side's host binary and plugins folder.
other_build() { mkdir -p /tmp/other && tar -C /tmp/other -xJf .devpack_b/device.tar.xz; }
side_build() { if [ $1 = this ]; then BIN=$H; PL=$P; else BIN=/tmp/other/.device/host; PL=/tmp/other/.device/plugins; fi; }
# `decode_vs RUN.json FIRST.json`: two `host generate --json` outputs as
# "RUN's decode tok/s | equal" (the same tokens) or "... | parts at token N".
decode_vs() {
  python3 -c "
import json, sys
a, f = (json.load(open(p))['tokens'] for p in sys.argv[1:])
d = next((i for i, (x, y) in enumerate(zip(a, f)) if x != y), None if len(a) == len(f) else min(len(a), len(f)))
print(f\"{json.load(open(sys.argv[1]))['decode_tokens_per_s']:.1f} | {'equal' if d is None else f'parts at token {d}'}\")
" "$1" "$2"
}
# The real default model, 4-bit (pack_smollm2_q4.sh), from its two halves
# copied to /tmp/mlxparts by earlier calls: /tmp/smollm2-q4.
smollm2_q4() { [ -d /tmp/smollm2-q4 ] || cat /tmp/mlxparts/smq4_aa /tmp/mlxparts/smq4_ab | tar -C /tmp -xf -; }
# `perf_kit`: sets PERF to the machine's perf or to the one pack_device.sh
# packed from the build machine (its own libraries only; the profiled
# command gets the caller's LD_LIBRARY_PATH back through `env`); false if
# neither.
perf_kit() {
  if command -v perf > /dev/null; then PERF=(perf); return 0; fi
  [ -f .devpack/perfkit.tar.xz ] || return 1
  [ -x /tmp/perfkit/perf ] || tar -C /tmp -xJf .devpack/perfkit.tar.xz
  PERF=(env LD_LIBRARY_PATH=/tmp/perfkit/lib /tmp/perfkit/perf)
}
