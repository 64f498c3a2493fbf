"""The fused decode projections of model-kit (`plugin-api/model-kit/src/gemv.rs`,
read from the source as the engine builds it) at the shapes of one Qwen3-8B
layer and its LM head (bf16, hidden 4096, MLP 12288, 32 query and 8 K/V
heads of 128, vocabulary 151936).

By default, with the engine's split (`split()` below mirrors `gemv::split_rows`):
the largest difference from the separate MLX ops they replace, and wall
time per call of both over enough distinct weights that each call reads
them from memory (host-bound for the small kernels: one Python call costs
tens of microseconds; the kernels' own durations need Nsight Compute).

Under Nsight Compute (`--ncu-log FILE`) every split of the work (warps per
block, rows per group, warps sharing one row's K) runs twice on one weight
set and FILE lists the launches in order; `--parse NCU_CSV FILE` then reads
the kernels' own durations (the second launch of each) and prints the
fastest splits per case beside the engine's and, for the LM head, MLX's
matmul: what `gemv::split` is chosen from (device_gemv_ncu.sh).
Usage: gemv_probe.py [--rows 1]
       ncu ... gemv_probe.py --ncu-log FILE [--cases A,B]; gemv_probe.py --parse NCU_CSV FILE [--top 6]"""
import argparse
import collections
import csv
import io
import itertools
import json
import re
import struct
import time
from pathlib import Path

try:
    import mlx.core as mx
    import mlx.nn as nn
except ImportError:  # --parse reads files only
    mx = nn = None

ROOT = Path(__file__).resolve().parents[3]
HIDDEN, INTER, Q, KV, VOCAB, EPS = 4096, 12288, 4096, 1024, 151936, 1e-6
NCU_SPLITS = list(itertools.product((4, 8), (1, 2, 4), (1, 2, 4)))
CASES = {
    # name: ((NORM, WEIGHTS, PAIR, RESIDUAL), weight shapes)
    "norm + q/k/v": ((1, 3, 0, 0), [(Q, HIDDEN), (KV, HIDDEN), (KV, HIDDEN)]),
    "o + residual": ((0, 1, 0, 1), [(HIDDEN, Q)]),
    "norm + gate/up + swiglu": ((1, 2, 1, 0), [(INTER, HIDDEN), (INTER, HIDDEN)]),
    "down + residual": ((0, 1, 0, 1), [(HIDDEN, INTER)]),
    "lm head": ((0, 1, 0, 0), [(VOCAB, HIDDEN)]),
}


def rust_source():
    text = (ROOT / "plugin-api/model-kit/src/gemv.rs").read_text()
    return re.search(r'pub const SOURCE: &str = r#"(.*?)"#;', text, re.S).group(1)


def defines(flags):
    norm, weights, pair, residual = flags
    return f"#define NORM {norm}\n#define WEIGHTS {weights}\n#define PAIR {pair}\n#define RESIDUAL {residual}\n"


def split(flags, total, k, m=1):
    """gemv::split_rows' choice as (warps, rows per group, k split); keep the two alike."""
    norm, weights, pair, residual = flags
    if norm and not pair:
        rows, widest = 4, 2
    elif pair:
        rows, widest = 2, 4
    elif residual and m > 1:
        rows, widest = (2 if k >= 2 * total else 4), 4
    elif residual and k >= 2 * total:
        rows, widest = 4, 4
    else:
        rows, widest = 1, 4
    ks = widest
    while ks > 1 and (k // ks < 1024 or k % (256 * ks)):
        ks //= 2
    return (4, rows, ks)


def timed(calls, n):
    mx.eval(calls())
    mx.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        mx.eval(calls())
    mx.synchronize()
    return (time.perf_counter() - t) / n


class Case:
    def __init__(self, name, flags, shapes, m, budget):
        self.name, self.flags, self.shapes, self.m = name, flags, shapes, m
        self.per = sum(n * k * 2 for n, k in shapes)
        self.count = max(2, int(budget // self.per))
        self.reps = max(3, int(2 * budget // (self.per * self.count)))
        mx.random.seed(0)
        self.sets = [[mx.random.normal(s).astype(mx.bfloat16) * 0.02 for s in shapes] for _ in range(self.count)]
        self.k = shapes[0][1]
        self.x = mx.random.normal((1, m, self.k)).astype(mx.bfloat16)
        self.g = (1 + 0.1 * mx.random.normal((self.k,))).astype(mx.bfloat16)
        self.r = mx.random.normal((1, m, shapes[0][0])).astype(mx.bfloat16)
        mx.eval(self.sets, self.x, self.g, self.r)
        norm, nw, pair, res = flags
        self.ins = ["x"] + (["g"] if norm else []) + [f"w{i}" for i in range(nw)] + (["res"] if res else [])
        self.outs = ["out0"] if (pair or res) else [f"out{i}" for i in range(nw)]
        src = defines(flags) + rust_source()
        self.kernel = mx.fast.cuda_kernel("probe_%d%d%d%d" % flags, self.ins, self.outs, src, ensure_row_contiguous=True)
        self.swiglu = mx.compile(lambda g, u: nn.silu(g) * u)
        self.want = self.plain(self.sets[0])

    def plain(self, ws):
        norm, _, pair, res = self.flags
        xx = mx.fast.rms_norm(self.x, self.g, EPS) if norm else self.x
        ys = [xx @ w.T for w in ws]
        if pair:
            return [self.swiglu(ys[0], ys[1])]
        if res:
            return [self.r + ys[0]]
        return ys

    def fused(self, ws, cfg):
        warps, rows, ks = cfg
        norm, nw, pair, res = self.flags
        n_out = [w.shape[0] for w in ws]
        out_rows = [n_out[0]] if (pair or res) else n_out
        eps_bits = struct.unpack("<i", struct.pack("<f", EPS))[0]
        inputs = [self.x] + ([self.g] if norm else []) + ws + ([self.r] if res else [])
        tmpl = [("M", self.m), ("K", self.k), ("N0", n_out[0]), ("N1", n_out[1] if nw > 1 else 0),
                ("N2", n_out[2] if nw > 2 else 0), ("R", rows), ("WARPS", warps), ("KS", ks), ("EPS_BITS", eps_bits)]
        blocks = sum(out_rows) // (warps // ks * rows)
        return self.kernel(inputs=inputs, template=tmpl, grid=(blocks * warps * 32, 1, 1),
                           threadgroup=(warps * 32, 1, 1), output_shapes=[(1, self.m, n) for n in out_rows],
                           output_dtypes=[mx.bfloat16] * len(out_rows))

    def valid(self, cfg):
        warps, rows, ks = cfg
        return ks <= warps and self.k % (256 * ks) == 0 and all(n % (warps // ks * rows) == 0 for n, _ in self.shapes)

    def time_plain(self):
        return timed(lambda: [self.plain(ws) for ws in self.sets], self.reps) / self.count

    def time_fused(self, cfg):
        t = timed(lambda: [self.fused(ws, cfg) for ws in self.sets], self.reps) / self.count
        got = self.fused(self.sets[0], cfg)
        diff = max(mx.abs(w.astype(mx.float32) - o.astype(mx.float32)).max().item() for w, o in zip(self.want, got))
        return t, diff

    def total(self):
        norm, nw, pair, res = self.flags
        return self.shapes[0][0] if (pair or res) else sum(n for n, _ in self.shapes)


def ncu_run(a):
    """Each split twice on one weight set (Nsight Compute flushes the caches
    before each kernel); the LM head's MLX matmul twice first."""
    log = []
    for name, (flags, shapes) in CASES.items():
        if a.cases and name not in a.cases.split(","):
            continue
        c = Case(name, flags, shapes, a.rows, 1)
        if flags == (0, 1, 0, 0):
            for _ in range(2):
                mx.eval(c.x @ c.sets[0][0].T)
                mx.synchronize()
            log.append({"case": name, "plain": True})
        for cfg in NCU_SPLITS:
            if not c.valid(cfg):
                continue
            try:
                for _ in range(2):
                    mx.eval(c.fused(c.sets[0], cfg))
                    mx.synchronize()
            except Exception as e:  # noqa: BLE001 - a split that cannot launch is reported, not fatal
                print(f"  {name} {cfg}: {e}")
                continue
            log.append({"case": name, "cfg": cfg, "per": c.per, "ours": split(flags, c.total(), c.k, c.m)})
            Path(a.ncu_log).write_text(json.dumps(log))
        del c


def ncu_parse(csv_path, log_path, top):
    text = open(csv_path, errors="replace").read()
    rows = [r for r in csv.DictReader(io.StringIO(text[text.find('"ID"'):])) if r.get("Metric Name") == "gpu__time_duration.sum"]
    scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}
    kernels = [(r["Kernel Name"], float(r["Metric Value"].replace(",", "")) * scale[r["Metric Unit"]]) for r in rows]
    log = json.loads(Path(log_path).read_text())
    probes = [us for n, us in kernels if "probe" in n]
    others = [(n, us) for n, us in kernels if "probe" not in n]
    by_case = collections.defaultdict(list)
    plain = {}
    i = 0
    for e in log:
        if e.get("plain"):
            plain[e["case"]] = others
            continue
        first, second = probes[i], probes[i + 1]
        i += 2
        by_case[e["case"]].append((second, tuple(e["cfg"]), e, first))
    for case, runs in by_case.items():
        runs.sort()
        e0 = runs[0][2]
        print(f"\n### {case} ({e0['per'] / 1e6:.0f} MB)")
        if case in plain:
            names = collections.Counter(n[:60] for n, _ in plain[case])
            print(f"MLX's matmul: {sum(us for _, us in plain[case]) / 2:.1f} us a launch (mean of two); {dict(names)}")
        print("| warps, rows, k split | us (second launch) | GB/s | first launch us |")
        print("|---|---|---|---|")
        ours = tuple(e0["ours"])
        for us, cfg, e, first in runs[:top] + [r for r in runs[top:] if r[1] == ours]:
            mark = " (engine)" if cfg == ours else ""
            print(f"| {cfg}{mark} | {us:.1f} | {e['per'] / us / 1e3:.0f} | {first:.1f} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--bytes", type=float, default=2e9)
    ap.add_argument("--top", type=int, default=6)
    ap.add_argument("--ncu-log")
    ap.add_argument("--cases", help="with --ncu-log: only these (comma-separated names)")
    ap.add_argument("--parse", nargs=2, metavar=("NCU_CSV", "LOG"))
    a = ap.parse_args()
    if a.parse:
        return ncu_parse(*a.parse, a.top)
    if a.ncu_log:
        return ncu_run(a)
    print(f"rows of x: {a.rows}")
    print("| fusion | weights | MLX ops us | MLX GB/s | fused us | fused GB/s | max diff | split |")
    print("|---|---|---|---|---|---|---|---|")
    for name, (flags, shapes) in CASES.items():
        c = Case(name, flags, shapes, a.rows, a.bytes)
        base = c.time_plain()
        ours = split(flags, c.total(), c.k, c.m)
        t, diff = c.time_fused(ours)
        print(f"| {name} | {' + '.join(f'{n}x{kk}' for n, kk in shapes)} | {base * 1e6:.1f} | {c.per / base / 1e9:.0f} | "
              f"{t * 1e6:.1f} | {c.per / t / 1e9:.0f} | {diff:.3g} | {ours} |")


if __name__ == "__main__":
    main()
