"""Where a quantized K/V layer call's time goes on the GPU, op by op, at the
shape of one Qwen3-8B layer over 16 rows of 8192 tokens (8 K/V heads of 128,
8-bit codes in groups of 64 packed beside their scales and biases in one
bf16 row, as plugin-api/kv-quant stores them). Usage: kvquant_ops.py"""
import time

import mlx.core as mx

B, H, T, D, HQ, CAP = 16, 8, 8192, 128, 32, 8448
BITS, GROUP = 8, 64
NW = D * BITS // 32 * 2          # uint32 words as bf16 slots
NG = D // GROUP
W = NW + 2 * NG


def timed(name, f, n=36):
    for _ in range(3):
        mx.eval(f())
    mx.synchronize()
    t = time.perf_counter()
    outs = [f() for _ in range(n)]
    mx.eval(outs)
    mx.synchronize()
    print(f"| {name} | {(time.perf_counter() - t) / n * 1e3:.3f} ms per layer call |")


buf = mx.random.normal((B, H, CAP, W)).astype(mx.bfloat16)
fetched = buf[:, :, :T, :]
q = mx.random.normal((B, HQ, 1, D)).astype(mx.bfloat16)
mask = mx.ones((B, 1, 1, T), dtype=mx.bool_)
plain_k = mx.random.normal((B, H, T, D)).astype(mx.bfloat16)
plain_v = mx.random.normal((B, H, T, D)).astype(mx.bfloat16)
kc = mx.quantize(plain_k, group_size=GROUP, bits=BITS)
mx.eval(buf, q, mask, plain_k, plain_v, *kc)


def parts(x):
    return x[..., :NW].view(mx.uint32), x[..., NW:NW + NG], x[..., NW + NG:]


def deq(x):
    w, s, b = parts(x)
    return mx.dequantize(w, s, b, group_size=GROUP, bits=BITS).astype(mx.bfloat16)


print("| op | time |\n|---|---|")
timed("plain bf16 sdpa (the bf16 cache's call)", lambda: mx.fast.scaled_dot_product_attention(q, plain_k, plain_v, scale=0.088, mask=mask))
timed("slice + view of the packed rows (words only)", lambda: parts(fetched)[0] + 0)
timed("dequantize of contiguous codes", lambda: mx.dequantize(*kc, group_size=GROUP, bits=BITS))
timed("dequantize of the packed rows (slice, view, dequantize)", lambda: deq(fetched))
timed("packed K and V dequantized + sdpa (the quantized cache's call)",
      lambda: mx.fast.scaled_dot_product_attention(q, deq(fetched), deq(fetched), scale=0.088, mask=mask))
