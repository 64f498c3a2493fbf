"""Sums the kernel durations that Nsight Compute measured
(`ncu --csv --metrics gpu__time_duration.sum ... > FILE`) by kernel name
and grid: count, total and mean microseconds, largest total first, and the
device time per step given how many steps the profiled launches cover
(`--steps N`, e.g. the count of the LM head's kernel). `--split-at NAME`
also sums the launches between consecutive kernels whose name contains
NAME, in launch order (e.g. `gather`: the embedding lookup that opens each
prefill chunk and step).
Usage: ncu_kernels.py FILE [--steps N] [--top 30] [--split-at NAME]"""
import argparse
import collections
import csv
import io


def launches(path):
    """(kernel name, grid, block, microseconds) of every launch, in order."""
    text = open(path, errors="replace").read()
    start = text.find('"ID"')
    out = []
    for r in csv.DictReader(io.StringIO(text[start:])):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        v = float(r["Metric Value"].replace(",", ""))
        unit = r["Metric Unit"]
        us = v / 1e3 if unit in ("ns", "nsecond") else v * 1e3 if unit in ("ms", "msecond") else v
        out.append((r["Kernel Name"], r["Grid Size"], r["Block Size"], us))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--steps", type=float)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--split-at")
    a = ap.parse_args()
    rows = launches(a.file)
    tot = collections.defaultdict(lambda: [0, 0.0])
    for name, grid, block, us in rows:
        key = (name[:70], grid, block)
        tot[key][0] += 1
        tot[key][1] += us
    n = len(rows)
    us = sum(r[3] for r in rows)
    print(f"{n} kernels, {us / 1e3:.2f} ms in all" + (f"; per step: {n / a.steps:.0f} kernels, {us / a.steps / 1e3:.3f} ms" if a.steps else ""))
    if a.split_at:
        cuts = [i for i, r in enumerate(rows) if a.split_at in r[0]]
        print(f"| stretch from `{a.split_at}` (grid) | kernels | ms | of it the `{a.split_at}` kernel, ms |")
        print("|---|---|---|---|")
        for lo, hi in zip(cuts, cuts[1:] + [n]):
            part = rows[lo:hi]
            print(f"| launch {lo} {rows[lo][1]} | {len(part)} | {sum(r[3] for r in part) / 1e3:.2f} | {rows[lo][3] / 1e3:.2f} |")
    print("| kernel | grid | block | count | total us | mean us |")
    print("|---|---|---|---|---|---|")
    for (name, grid, block), (c, t) in sorted(tot.items(), key=lambda kv: -kv[1][1])[: a.top]:
        print(f"| {name} | {grid} | {block} | {c} | {t:.0f} | {t / c:.2f} |")


if __name__ == "__main__":
    main()
