"""Our float32 product kernel (native/stable-gemm) against the BLAS library
it stands in front of, through MLX on the CPU, at SmolLM2-135M's shapes.

`x @ W.T` with W stored [N, K] is the route our `cblas_sgemm` takes;
`x @ Wt` with the same weight stored [K, N] goes on to OpenBLAS. Prints
ms and GFMA/s (multiply-adds per second) for each.

Usage (LD_LIBRARY_PATH at the engine's libmlx folder, so MLX loads the
runtime with our kernel):
  LD_LIBRARY_PATH=$PWD/.mlx/lib .venv/bin/python tests/bench/gemm_vs_blas.py
"""
import time

import mlx.core as mx

SHAPES = [(1536, 576), (576, 1536), (49152, 576)]  # (N, K): MLP up, MLP down, LM head
ROWS = [1, 16, 64, 512]


def timed(f, n=20):
    f()
    t0 = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - t0) / n


def main():
    mx.set_default_device(mx.cpu)
    for n, k in SHAPES:
        w = mx.random.normal((n, k))
        wt = mx.array(w.T)
        mx.eval(w, wt)
        for m in ROWS:
            x = mx.random.normal((m, k))
            mx.eval(x)
            ours = timed(lambda: mx.eval(x @ w.T))
            blas = timed(lambda: mx.eval(x @ wt))
            g = m * n * k / 1e9
            print(f"N={n} K={k} rows={m}: ours {ours * 1e3:.2f} ms {g / ours:.1f} GFMA/s"
                  f" | BLAS {blas * 1e3:.2f} ms {g / blas:.1f} GFMA/s")


if __name__ == "__main__":
    main()
