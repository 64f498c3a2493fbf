"""Which multi-token queries does MLX's CUDA backend serve with its fused
single-pass vector kernel (no per-shape setup) rather than cuDNN (a graph
build per new shape)? For each query length L, attends L causal queries over
key lengths never seen before and reports the median time of a call, and
whether the result equals attending each query alone over its prefix of
the keys (our per-query path) bit for bit.
Usage: sdpa_vector_probe.py [HEAD_DIM]"""
import sys
import time

import mlx.core as mx

D = int(sys.argv[1]) if len(sys.argv) > 1 else 128
H, HKV, B = 16, 8, 1
scale = D ** -0.5


def per_query(q, k, v):
    L, S = q.shape[2], k.shape[2]
    rows = [mx.fast.scaled_dot_product_attention(q[:, :, i:i + 1], k[:, :, :S - L + i + 1], v[:, :, :S - L + i + 1], scale=scale) for i in range(L)]
    return mx.concatenate(rows, axis=2)


for L in [1, 2, 3, 4, 5, 8]:
    times, same, worst = [], 0, 0.0
    for n in range(20):
        S = 700 + 37 * n + L  # a key length new to the process every call
        q = mx.random.normal((B, H, L, D)).astype(mx.bfloat16)
        k = mx.random.normal((B, HKV, S, D)).astype(mx.bfloat16)
        v = mx.random.normal((B, HKV, S, D)).astype(mx.bfloat16)
        mx.eval(q, k, v)
        t = time.perf_counter()
        out = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask="causal" if L > 1 else None)
        mx.eval(out)
        times.append(time.perf_counter() - t)
        ref = per_query(q, k, v)
        mx.eval(ref)
        diff = mx.abs(out.astype(mx.float32) - ref.astype(mx.float32)).max().item()
        same += diff == 0
        worst = max(worst, diff)
    times.sort()
    print(f"L={L} head_dim={D}: median {times[len(times)//2]*1e3:.3f} ms, max {times[-1]*1e3:.3f} ms over 20 new key lengths; equal to per-query {same}/20 (max diff {worst:.5f})", flush=True)
