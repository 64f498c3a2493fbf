"""A prompt's chunks attending over K/V that grow by one chunk per call, in
MLX alone, the way kv-plain stores them (storage grown in steps of 256
tokens by concatenation, each chunk written in place, a window of the first
S tokens read): per chunk, the wall time of all layers' attention and the
MLX buffer cache left at the end.

    kv_rows_alloc_probe.py bf16|parts|rows [--clear | --cache-limit GIB]

- bf16: plain K/V (kv-plain in the model dtype);
- parts: 8-bit affine codes kept as mx.quantize's three arrays, the window of
  each dequantized, then sdpa;
- rows: the same codes as kv-quant stores them, one row of uint16 words per
  token (`[words | scales | biases]`), the window's parts taken apart by a
  slice of the last axis and a bit-cast (`view`) each, then dequantized.

--clear empties MLX's buffer cache after every chunk, as mlx-lm's batch
generator does; --cache-limit GIB bounds it (`mx.set_cache_limit`).

Defaults: the Qwen3-8B layer shape, 36 layers, 16 rows, 205 tokens per row
per chunk up to 8192 (docs/benchmarks.md, "Prefill over quantized K/V").
"""
import argparse
import time

import mlx.core as mx

ap = argparse.ArgumentParser()
ap.add_argument("variant", choices=["bf16", "parts", "rows"])
ap.add_argument("--rows", type=int, default=16)
ap.add_argument("--chunk", type=int, default=205)
ap.add_argument("--tokens", type=int, default=8192)
ap.add_argument("--layers", type=int, default=36)
ap.add_argument("--clear", action="store_true")
ap.add_argument("--cache-limit", type=float, help="MLX's buffer cache limit, GiB")
a = ap.parse_args()

if a.cache_limit is not None:
    mx.set_cache_limit(int(a.cache_limit * 2 ** 30))
HQ, HK, D, STEP, GROUP, BITS = 32, 8, 128, 256, 64, 8
B, L = a.rows, a.chunk
mx.random.seed(0)
q = mx.random.normal((B, HQ, L, D)).astype(mx.bfloat16)
k_new = mx.random.normal((B, HK, L, D)).astype(mx.bfloat16)
v_new = mx.random.normal((B, HK, L, D)).astype(mx.bfloat16)
mx.eval(q, k_new, v_new)


def encode(x):
    """The arrays one chunk's keys (or values) are stored as."""
    if a.variant == "bf16":
        return [x]
    parts = mx.quantize(x, GROUP, BITS)
    if a.variant == "parts":
        return list(parts)
    return [mx.concatenate([p.view(mx.uint16) for p in parts], axis=-1)]


def window(stored, s):
    """The first s tokens as values for attention."""
    if a.variant == "bf16":
        return stored[0][:, :, :s, :]
    if a.variant == "parts":
        return mx.dequantize(*[p[:, :, :s, :] for p in stored], group_size=GROUP, bits=BITS)
    r = stored[0][:, :, :s, :]
    nw, ng = D * BITS // 32 * 2, D // GROUP
    words, scales, biases = r[..., :nw].view(mx.uint32), r[..., nw:nw + ng], r[..., nw + ng:]
    return mx.dequantize(words, scales.view(mx.bfloat16), biases.view(mx.bfloat16), group_size=GROUP, bits=BITS)


def grown(stored, cap):
    """Storage with room for cap tokens: the old one and zeros, concatenated."""
    return [mx.concatenate([s, mx.zeros(s.shape[:2] + (cap - s.shape[2],) + s.shape[3:], s.dtype)], axis=2)
            for s in stored]


stores = [[None, None] for _ in range(a.layers)]
idx, times = 0, []
while idx + L <= a.tokens:
    t0 = time.perf_counter()
    outs = []
    for layer in stores:
        for j, new in enumerate((encode(k_new), encode(v_new))):
            if layer[j] is None:
                layer[j] = [mx.zeros((B, HK, 0) + p.shape[3:], p.dtype) for p in new]
            cap = layer[j][0].shape[2]
            if idx + L > cap:
                layer[j] = grown(layer[j], cap + STEP * ((idx + L - cap + STEP - 1) // STEP))
            for stored, part in zip(layer[j], new):
                stored[:, :, idx:idx + L, :] = part
        k, v = window(layer[0], idx + L), window(layer[1], idx + L)
        outs.append(mx.fast.scaled_dot_product_attention(q, k, v, scale=D ** -0.5, mask="causal"))
    mx.eval(outs, *[s for layer in stores for kv in layer for s in kv])
    mx.synchronize()
    if a.clear:
        mx.clear_cache()
    idx += L
    times.append((time.perf_counter() - t0) * 1000)
gib = 2 ** 30
print(f"{a.variant}{' --clear' if a.clear else ''}{f' --cache-limit {a.cache_limit}' if a.cache_limit else ''}: {len(times)} chunks, {sum(times):.0f} ms in all, median {sorted(times)[len(times) // 2]:.0f} ms, "
      f"max {max(times):.0f} ms; MLX active {mx.get_active_memory() / gib:.1f} GiB, "
      f"cache {mx.get_cache_memory() / gib:.1f} GiB, peak {mx.get_peak_memory() / gib:.1f} GiB")
