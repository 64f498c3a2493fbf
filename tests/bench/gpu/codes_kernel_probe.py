"""The K/V codes decode kernel alone on the GPU, at the shape of one
Qwen3-8B layer (32 query heads over 8 K/V heads of 128): its time per layer
call against MLX's fused bf16 attention over the same K/V dequantized, and
its output against that attention's (max abs difference), for each
`--variant U:BLOCKS` (target blocks; U, keys loaded per lane slot before
use, is read only by earlier kernel bodies given with --body-file).
The kernel's text is read from plugin-api/kv-quant/src/codes_attention.rs
and model-kit's decode_attention.rs, as the engine builds it.
Usage: codes_kernel_probe.py --rows 16 --keys 32768 --bits 4 [--variant 2:528 ...]
[--body-file F] (another kernel body, e.g. an earlier version, for an A/B)"""
import argparse
import re
import time
from pathlib import Path

import mlx.core as mx

ROOT = Path(__file__).resolve().parents[3]
HQ, HKV, D, GROUP, THREADS = 32, 8, 128, 64, 256


def raw(path, name):
    text = (ROOT / path).read_text()
    return re.search(rf'const {name}: &str = r#"(.*?)"#;', text, re.S).group(1)


def splits(rows, keys, target):
    want = (target + rows * HKV - 1) // (rows * HKV)
    return max(1, min(want, keys // 256))


def timed(f, n=20):
    for _ in range(3):
        mx.eval(f())
    mx.synchronize()
    t = time.perf_counter()
    outs = [f() for _ in range(n)]
    mx.eval(outs)
    mx.synchronize()
    return (time.perf_counter() - t) / n * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--keys", type=int, default=32768)
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--variant", action="append", default=[])
    ap.add_argument("--body-file", help="another kernel body, whole (e.g. an earlier version), instead of the sources'")
    a = ap.parse_args()
    body = raw("plugin-api/kv-quant/src/codes_attention.rs", "SOURCE")
    merge_tail = raw("plugin-api/model-kit/src/decode_attention.rs", "BLOCK_MERGE")
    source = Path(a.body_file).read_text() if a.body_file else body + merge_tail
    decode = mx.fast.cuda_kernel("codes_probe", ["q", "k", "v", "mask"], ["part", "ml"], source,
                                 ensure_row_contiguous=False)
    merge = mx.fast.cuda_kernel("merge_probe", ["part", "ml"], ["out"],
                                raw("plugin-api/model-kit/src/decode_attention.rs", "MERGE_SOURCE"),
                                ensure_row_contiguous=False)
    b, t, bits, r = a.rows, a.keys, a.bits, HQ // HKV
    scale = D ** -0.5
    mx.random.seed(0)
    q = mx.random.normal((b, HQ, 1, D)).astype(mx.bfloat16)
    rows = []
    for _ in range(2):
        x = mx.random.normal((b, HKV, t, D)).astype(mx.bfloat16)
        w, s, z = mx.quantize(x, group_size=GROUP, bits=bits)
        rows.append(mx.concatenate([w.view(mx.uint16), s.view(mx.uint16), z.view(mx.uint16)], axis=-1))
        mx.eval(rows[-1])
        del x
    nw = D * bits // 16

    def plain(codes):
        w = codes[..., :nw].view(mx.uint32)
        s = codes[..., nw:nw + D // GROUP].view(mx.bfloat16)
        z = codes[..., nw + D // GROUP:].view(mx.bfloat16)
        return mx.dequantize(w, s, z, group_size=GROUP, bits=bits)

    kd, vd = plain(rows[0]), plain(rows[1])
    mx.eval(kd, vd)
    want = mx.fast.scaled_dot_product_attention(q, kd, vd, scale=scale)
    base = timed(lambda: mx.fast.scaled_dot_product_attention(q, kd, vd, scale=scale))
    print(f"rows {b}, keys {t}, {bits}-bit codes")
    print(f"| bf16 K/V, MLX's fused sdpa | {base:.3f} ms per layer call | - |")
    scaled = (q * scale).reshape(b, HQ, D)
    no_mask = mx.array([False])
    # Left padding as a server's rows of different lengths have it: row i
    # starts i * T / (2B) keys in.
    starts = mx.array([i * t // (2 * b) for i in range(b)])
    ragged = (mx.arange(t)[None, :] >= starts[:, None])
    want_ragged = mx.fast.scaled_dot_product_attention(q, kd, vd, scale=scale, mask=ragged[:, None, None, :])
    for variant in a.variant or ["2:528"]:
        u, target = (int(x) for x in variant.split(":"))
        n = splits(b, t, target)
        blocks = b * HKV * n

        def run(mask=None):
            part, ml = decode(inputs=[scaled, rows[0], rows[1], no_mask if mask is None else mask],
                              template=[("BITS", bits), ("GROUP", GROUP), ("D", D), ("R", r), ("HKV", HKV),
                                        ("PER_WORD", 2), ("VALUES", 0), ("HAS_MASK", mask is not None), ("U", u)],
                              grid=(blocks * THREADS, 1, 1), threadgroup=(THREADS, 1, 1),
                              output_shapes=[(blocks, r, D), (blocks, r, 2)],
                              output_dtypes=[mx.float32, mx.float32])
            return merge(inputs=[part.reshape(b * HKV, n, r, D), ml], template=[("D", D), ("R", r)],
                         grid=((b * HQ * D + THREADS - 1) // THREADS * THREADS, 1, 1), threadgroup=(THREADS, 1, 1),
                         output_shapes=[(b, HQ, 1, D)], output_dtypes=[mx.bfloat16])[0]

        got = run()
        diff = mx.abs(got.astype(mx.float32) - want.astype(mx.float32)).max().item()
        got_ragged = run(ragged)
        diff_ragged = mx.abs(got_ragged.astype(mx.float32) - want_ragged.astype(mx.float32)).max().item()
        ms = timed(run)
        print(f"| codes kernel, U {u}, target blocks {target} ({n} slices) | {ms:.3f} ms per layer call "
              f"| {base / ms:.2f}x of bf16; max abs diff {diff:.2e}, left-padded rows {diff_ragged:.2e} |")


if __name__ == "__main__":
    main()
