"""Can a prompt chunk's causal attention skip cuDNN's per-shape graph build
by running at a shape the process has run before? Qwen3-8B's attention
shape (32 query heads, 8 K/V heads, head dim 128), bf16, keys past=2048
tokens long before the chunk (a prompt's second 2048-token chunk).

1. Prefill: the process first runs a 2048-query chunk over 4096 keys. Then
   for chunk lengths L never run: the call at (L, 2048 + L) as it is, and
   the same queries and keys padded at the end by p = 2048 - L zero rows
   (same diagonal: the valid rows see the same keys), whose shape is the one
   already run. Reports each first call's time and whether the valid rows
   equal the unpadded call's bit for bit.
2. Decode (1 query): MLX sends it to cuDNN when the keys are a slice of a
   buffer whose width is a multiple of 256 (a new graph per width), else
   to its vector kernel. Reports the first call at a new width and the
   per-call time of 36 chained calls, both ways.
Usage: sdpa_bucket_probe.py"""
import time

import mlx.core as mx

H, HKV, D, PAST = 32, 8, 128, 2048
scale = D**-0.5


def rand(*shape):
    return mx.random.normal(shape).astype(mx.bfloat16)


def timed(f):
    t = time.perf_counter()
    out = f()
    mx.eval(out)
    return out, (time.perf_counter() - t) * 1e3


def causal(q, k, v):
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask="causal")


def pad_rows(x, p):
    return mx.concatenate([x, mx.zeros((*x.shape[:2], p, x.shape[3]), x.dtype)], axis=2)


mx.eval(causal(rand(1, H, 2048, D), rand(1, HKV, 4096, D), rand(1, HKV, 4096, D)))
print("prefill, a chunk of L queries after 2048 keys:")
for L in [2047, 2001, 1900, 1793]:
    q, k, v = rand(1, H, L, D), rand(1, HKV, PAST + L, D), rand(1, HKV, PAST + L, D)
    mx.eval(q, k, v)
    p = 2048 - L
    padded, t_pad = timed(lambda: causal(pad_rows(q, p), pad_rows(k, p), pad_rows(v, p))[:, :, :L])
    plain, t_plain = timed(lambda: causal(q, k, v))
    same = mx.array_equal(plain, padded).item()
    diff = mx.max(mx.abs(plain.astype(mx.float32) - padded.astype(mx.float32))).item()
    print(f"  L={L}: padded to 2048 {t_pad:6.1f} ms, as it is {t_plain:6.1f} ms; valid rows equal: {same} (max diff {diff:g})")

print("decode, 1 query over S keys of a buffer W wide:")
for route, extra in [("cuDNN (W a multiple of 256)", 0), ("vector kernel (W = S + 8)", 8)]:
    for S in [1000, 1300]:
        W = (S + 255) // 256 * 256 if extra == 0 else S + extra
        kb, vb = rand(1, HKV, W, D), rand(1, HKV, W, D)
        qs = [rand(1, H, 1, D) for _ in range(36)]
        mx.eval(kb, vb, *qs)
        k, v = kb[:, :, :S], vb[:, :, :S]
        mx.eval(k, v)
        _, first = timed(lambda: mx.fast.scaled_dot_product_attention(qs[0], k, v, scale=scale))
        runs = []
        for _ in range(5):
            _, t = timed(lambda: [mx.fast.scaled_dot_product_attention(q, k, v, scale=scale) for q in qs])
            runs.append(t / 36)
        print(f"  {route}, S={S}: first call {first:6.1f} ms, then {sorted(runs)[2] * 1e3:6.1f} us a call")
