#!/usr/bin/env bash
# Makes the real default model's 4-bit copy for the GPU machine (no model
# hub there; the f32 folder is larger than one device call carries):
# SmolLM2-135M-Instruct re-quantized by mlx_lm.convert to 4-bit groups of 32
# (as the GGUF's Q4_1) with bf16 scales and unquantized weights (float32
# ones would not fit two parts), tarred and split into .gpu_m1/smq4_aa and
# .gpu_m2/smq4_ab. Two device calls carry them to /tmp/mlxparts;
# device_env.sh's smollm2_q4 joins them into /tmp/smollm2-q4. Run on the
# build machine (needs .venv with mlx-lm and models/smollm2-135m-instruct).
set -euo pipefail
cd "$(dirname "$0")/../../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
LD_LIBRARY_PATH=$PWD/.mlx/lib .venv/bin/python -m mlx_lm convert --hf-path models/smollm2-135m-instruct \
  --mlx-path "$tmp/smollm2-q4" -q --q-bits 4 --q-group-size 32 --dtype bfloat16 > /dev/null
rm -rf .gpu_m1 .gpu_m2 && mkdir -p .gpu_m1 .gpu_m2
tar -C "$tmp" -cf - smollm2-q4 | split -b 44M - "$tmp/smq4_"
mv "$tmp/smq4_aa" .gpu_m1/ && mv "$tmp/smq4_ab" .gpu_m2/
[ ! -e "$tmp/smq4_ac" ] || { echo "the 4-bit folder needs more than two 44 MB parts" >&2; exit 1; }
du -sh .gpu_m1 .gpu_m2
