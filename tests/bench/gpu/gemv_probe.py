"""The fused decode projections of model-kit (`plugin-api/model-kit/src/gemv.rs`,
read from the source as the engine builds it) against the separate MLX ops
they replace, at the shapes of one Qwen3-8B layer (bf16, hidden 4096, MLP
12288, 32 query and 8 K/V heads of 128): microseconds per call, GB/s of
weights read, and the largest difference between the outputs. Enough
distinct weights are cycled that each call reads them from memory, not
from the L2 cache.
Usage: gemv_probe.py [--rows 1]"""
import argparse
import re
import struct
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

ROOT = Path(__file__).resolve().parents[3]
HIDDEN, INTER, Q, KV, EPS = 4096, 12288, 4096, 1024, 1e-6


def source(norm, weights, pair, residual):
    text = (ROOT / "plugin-api/model-kit/src/gemv.rs").read_text()
    body = re.search(r'pub const SOURCE: &str = r#"(.*?)"#;', text, re.S).group(1)
    two_from = int(re.search(r"pub const TWO_ROWS_FROM: i32 = (\d+);", text).group(1))
    defs = f"#define NORM {norm}\n#define WEIGHTS {weights}\n#define PAIR {pair}\n#define RESIDUAL {residual}\n"
    return defs + body, two_from


@mx.compile
def swiglu(g, u):
    return nn.silu(g) * u


def timed(calls, n):
    mx.eval(calls())
    mx.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        mx.eval(calls())
    mx.synchronize()
    return (time.perf_counter() - t) / n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--bytes", type=float, default=2e9)
    a = ap.parse_args()
    m = a.rows
    eps_bits = struct.unpack("<i", struct.pack("<f", EPS))[0]
    cases = {
        "norm + q,k,v": ((1, 3, 0, 0), [(Q, HIDDEN), (KV, HIDDEN), (KV, HIDDEN)]),
        "o + residual": ((0, 1, 0, 1), [(HIDDEN, Q)]),
        "norm + gate,up + swiglu": ((1, 2, 1, 0), [(INTER, HIDDEN), (INTER, HIDDEN)]),
        "down + residual": ((0, 1, 0, 1), [(HIDDEN, INTER)]),
    }
    print(f"rows of x: {m}")
    print("| fusion | weights | MLX ops us | MLX GB/s | fused us | fused GB/s | max diff | outputs |")
    print("|---|---|---|---|---|---|---|---|")
    for name, ((norm, nw, pair, res), shapes) in cases.items():
        src, two_from = source(norm, nw, pair, res)
        ins = ["x"] + (["g"] if norm else []) + [f"w{i}" for i in range(nw)] + (["res"] if res else [])
        outs = ["out0"] if (pair or res) else [f"out{i}" for i in range(nw)]
        kernel = mx.fast.cuda_kernel(f"probe_{norm}{nw}{pair}{res}", ins, outs, src, ensure_row_contiguous=True)
        per = sum(n * k * 2 for n, k in shapes)
        count = max(2, int(a.bytes // per))
        mx.random.seed(0)
        sets = [[mx.random.normal(s).astype(mx.bfloat16) * 0.02 for s in shapes] for _ in range(count)]
        k = shapes[0][1]
        x = mx.random.normal((1, m, k)).astype(mx.bfloat16)
        g = (1 + 0.1 * mx.random.normal((k,))).astype(mx.bfloat16)
        r = mx.random.normal((1, m, shapes[0][0])).astype(mx.bfloat16)
        mx.eval(sets, x, g, r)

        def plain(ws):
            xx = mx.fast.rms_norm(x, g, EPS) if norm else x
            ys = [xx @ w.T for w in ws]
            if pair:
                return [swiglu(ys[0], ys[1])]
            if res:
                return [r + ys[0]]
            return ys

        def fused(ws):
            n_out = [w.shape[0] for w in ws]
            out_rows = [n_out[0]] if (pair or res) else n_out
            rows = 2 if not res or sum(out_rows) // 16 >= two_from else 1
            inputs = [x] + ([g] if norm else []) + ws + ([r] if res else [])
            tmpl = [("M", m), ("K", k), ("N0", n_out[0]), ("N1", n_out[1] if nw > 1 else 0),
                    ("N2", n_out[2] if nw > 2 else 0), ("R", rows), ("EPS_BITS", eps_bits)]
            return kernel(inputs=inputs, template=tmpl, grid=(sum(out_rows) // rows * 32, 1, 1), threadgroup=(256, 1, 1),
                          output_shapes=[(1, m, n) for n in out_rows], output_dtypes=[mx.bfloat16] * len(out_rows))

        reps = max(3, int(4e9 // a.bytes))
        base = timed(lambda: [plain(ws) for ws in sets], reps) / count
        ours = timed(lambda: [fused(ws) for ws in sets], reps) / count
        want, got = plain(sets[0]), fused(sets[0])
        diff = max(mx.abs(w.astype(mx.float32) - o.astype(mx.float32)).max().item() for w, o in zip(want, got))
        print(f"| {name} | {' + '.join(f'{n}x{kk}' for n, kk in shapes)} | {base * 1e6:.1f} | {per / base / 1e9:.0f} | "
              f"{ours * 1e6:.1f} | {per / ours / 1e9:.0f} | {diff:.3g} | {len(got)} |")
        del sets


if __name__ == "__main__":
    main()
