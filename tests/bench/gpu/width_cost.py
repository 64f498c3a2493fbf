"""mlx-lm's cost of one target forward of L tokens over a KV cache, for the
verify widths speculation uses (diagnosis: is some width slow in MLX itself?).
Usage: width_cost.py MODEL_DIR"""
import sys
import time

import mlx.core as mx
from mlx_lm import load
from mlx_lm.models.cache import make_prompt_cache

model, _ = load(sys.argv[1])
cache = make_prompt_cache(model)
mx.eval(model(mx.arange(100, 164)[None], cache=cache))
for L in [1, 2, 3, 4, 5, 6, 8, 11]:
    times = []
    for rep in range(12):
        x = mx.arange(200, 200 + L)[None]
        t = time.perf_counter()
        mx.eval(model(x, cache=cache))
        times.append(time.perf_counter() - t)
        for c in cache:
            c.trim(L - 1)  # keep one token: the offset grows by one per call, as decoding does
    print(f"L={L:2d} first {times[0]*1e3:7.2f} ms  median {sorted(times[1:])[len(times)//2]*1e3:7.2f} ms  offset {cache[0].offset}")

# Prefill of prompt lengths never seen before: MLX's fused attention (cuDNN
# for multi-token queries on CUDA) against matmul + softmax.
import mlx_lm.models.base as base

fused = base.scaled_dot_product_attention


def unfused(queries, keys, values, cache, scale, mask, sinks=None):
    B, Hq, L, D = queries.shape
    Hkv, S = keys.shape[1], keys.shape[2]
    rep = Hq // Hkv
    q = (queries * scale).reshape(B, Hkv, rep, L, D)
    s = q @ mx.expand_dims(keys, 2).swapaxes(-1, -2)
    if isinstance(mask, str) or mask is not None:
        rows = mx.arange(S - L, S)[:, None]
        s = mx.where(rows >= mx.arange(S)[None], s, mx.array(-1e30, s.dtype))
    p = mx.softmax(s, axis=-1, precise=True)
    return (p @ mx.expand_dims(values, 2)).reshape(B, Hq, L, -1)


for name, fn in [("fused (cuDNN)", fused), ("unfused", unfused)]:
    for mod in list(sys.modules.values()):
        if getattr(mod, "scaled_dot_product_attention", None) in (fused, unfused) and mod.__name__.startswith("mlx_lm.models"):
            mod.scaled_dot_product_attention = fn
    row = []
    for i, L in enumerate([37, 111, 333, 777, 1500, 2048]):
        L += (name == "unfused")  # new lengths for the second pass too
        c = make_prompt_cache(model)
        t = time.perf_counter()
        mx.eval(model(mx.arange(1000, 1000 + L)[None], cache=c))
        first = time.perf_counter() - t
        c = make_prompt_cache(model)
        t = time.perf_counter()
        mx.eval(model(mx.arange(1000, 1000 + L)[None], cache=c))
        row.append(f"L={L}: new {first*1e3:.1f} ms, again {(time.perf_counter() - t)*1e3:.1f} ms")
    print(name, "|", " | ".join(row))
