#!/usr/bin/env bash
# Lays out .device/ for the GPU machine (which has no Rust): the stripped
# host binary, every plugin folder (plugin.toml + stripped library), libmlxc
# and the default model's tokenizer files; and .devpack/device.tar.xz, the
# same compressed (what a device call carries; device_env.sh unpacks it).
# Run on the build machine after `cargo xtask build`.
set -euo pipefail
cd "$(dirname "$0")/../../.."
rm -rf .device .devpack && mkdir -p .device/lib .device/plugins .device/tok .devpack
strip -o .device/host target/release/host
cp -L .mlx/lib/libmlxc.so .device/lib/ && strip .device/lib/libmlxc.so
for d in plugins/*/; do
  n=$(basename "$d"); lib=$(sed -n 's/^library *= *"\(.*\)"/\1/p' "$d/plugin.toml")
  mkdir -p ".device/plugins/$n" && cp "$d/plugin.toml" ".device/plugins/$n/"
  strip -o ".device/plugins/$n/$lib" "target/release/$lib"
done
for f in tokenizer.json tokenizer_config.json special_tokens_map.json generation_config.json; do
  cp models/smollm2-135m-instruct/$f .device/tok/ 2>/dev/null || true
done
tar -cJf .devpack/device.tar.xz .device
# perf for the device's host profiles (device_env.sh's perf_kit), when this
# machine has it: the binary and the libraries it links, less the C and C++
# runtimes the device has newer.
if command -v perf > /dev/null; then
  k=$(mktemp -d) && mkdir -p "$k/perfkit/lib" && cp "$(readlink -f "$(command -v perf)")" "$k/perfkit/perf"
  ldd "$k/perfkit/perf" | awk '{print $3}' | grep -v -E 'lib(c|m|pthread|dl|rt|stdc\+\+|gcc_s)\.so|ld-linux' | grep / | xargs -r cp -L -t "$k/perfkit/lib"
  tar -C "$k" -cJf .devpack/perfkit.tar.xz perfkit && rm -rf "$k"
fi
du -sh .device .devpack/*
