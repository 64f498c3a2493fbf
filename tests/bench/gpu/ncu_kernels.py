"""Sums the kernel durations that Nsight Compute measured
(`ncu --csv --metrics gpu__time_duration.sum ... > FILE`) by kernel name
and grid: count, total and mean microseconds, largest total first, and the
device time per step given how many steps the profiled launches cover
(`--steps N`, e.g. the count of the LM head's kernel).
Usage: ncu_kernels.py FILE [--steps N] [--top 30]"""
import argparse
import collections
import csv
import io


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--steps", type=float)
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    text = open(a.file, errors="replace").read()
    start = text.find('"ID"')
    rows = csv.DictReader(io.StringIO(text[start:]))
    tot = collections.defaultdict(lambda: [0, 0.0])
    for r in rows:
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        us = float(r["Metric Value"].replace(",", "")) / (1e3 if r["Metric Unit"] in ("ns", "nsecond") else 1)
        if r["Metric Unit"] == "msecond":
            us = float(r["Metric Value"].replace(",", "")) * 1e3
        key = (r["Kernel Name"][:70], r["Grid Size"], r["Block Size"])
        tot[key][0] += 1
        tot[key][1] += us
    n = sum(c for c, _ in tot.values())
    us = sum(t for _, t in tot.values())
    print(f"{n} kernels, {us / 1e3:.2f} ms in all" + (f"; per step: {n / a.steps:.0f} kernels, {us / a.steps / 1e3:.3f} ms" if a.steps else ""))
    print("| kernel | grid | block | count | total us | mean us |")
    print("|---|---|---|---|---|---|")
    for (name, grid, block), (c, t) in sorted(tot.items(), key=lambda kv: -kv[1][1])[: a.top]:
        print(f"| {name} | {grid} | {block} | {c} | {t:.0f} | {t / c:.2f} |")


if __name__ == "__main__":
    main()
