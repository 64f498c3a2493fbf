"""What a query length new to the process costs MLX's cuDNN attention, and
whether a second process pays it again: causal prefill attention at the
Qwen3-8B shape (32 query heads, 8 K/V heads, head dim 128) over K/V slices of
a 256-step cache, for query lengths never run in this process. Prints the
first call's and a repeat call's time per length; run it twice with the same
CUDA_CACHE_PATH to see what the driver's JIT cache keeps between processes.
`--layout blhd` hands the queries over as mlx-lm does (a transposed view).
Usage: sdpa_new_shape_probe.py [--layout bhld|blhd] LENGTH..."""
import argparse
import time

import mlx.core as mx

ap = argparse.ArgumentParser()
ap.add_argument("--layout", default="bhld")
ap.add_argument("lengths", type=int, nargs="+")
a = ap.parse_args()
H, HKV, D = 32, 8, 128


def call(L, past):
    S = past + L
    cap = (S + 255) // 256 * 256
    if a.layout == "blhd":
        q = mx.random.normal((1, L, H, D)).astype(mx.bfloat16).transpose(0, 2, 1, 3)
    else:
        q = mx.random.normal((1, H, L, D)).astype(mx.bfloat16)
    kc = mx.random.normal((1, HKV, cap, D)).astype(mx.bfloat16)
    vc = mx.random.normal((1, HKV, cap, D)).astype(mx.bfloat16)
    mx.eval(q, kc, vc)
    k, v = kc[:, :, :S], vc[:, :, :S]
    t = time.perf_counter()
    mx.eval(mx.fast.scaled_dot_product_attention(q, k, v, scale=D**-0.5, mask="causal"))
    return (time.perf_counter() - t) * 1e3


call(64, 0)  # one-time set-up (cuDNN handle) off the table
for L in a.lengths:
    past = 2048 if L < 2048 else 0
    first, again = call(L, past), call(L, past)
    print(f"{a.layout} L={L} past={past}: first {first:7.1f} ms, again {again:6.2f} ms", flush=True)
