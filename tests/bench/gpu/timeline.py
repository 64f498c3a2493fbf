"""Reads a CUDA timeline written by cupti_trace.c and splits it at markers a
process printed in wall-clock time: for each stretch between markers, its
wall time, the time the GPU was busy (kernels, copies, memsets; their
union), the kernel count, the host API calls that took the most time in it,
and the longest GPU idle gaps with the API calls under each. It says where
a stage's time goes when the kernels alone do not account for it (a cuDNN
graph build, an NVRTC compile and module load, a synchronisation).

Markers: `--rust-log FILE` takes the `host_engine::step` trace lines of a
`RUST_LOG=host_engine::step=trace` run (their RFC 3339 time stamps, each at
the end of what it reports; `--target host_engine::spec` takes the
speculative rounds' lines instead); `--markers FILE` takes `label realtime_ns`
lines (what the mlx-lm driver in device_prefill_timeline.sh prints).
`--after TEXT` starts at the last marker whose label holds TEXT (`--back N`:
N markers before it), e.g. the timed prompt after a warm-up; `--last N`
keeps the last N stretches and adds their mean (decode steps), and the
host API calls of those stretches by name: calls and ms per stretch
(`--kernels N`: also the N kernels taking most GPU time, by name).
Usage: timeline.py TRACE.csv (--rust-log F [--target T] | --markers F) [--after TEXT [--back N]] [--last N] [--gaps 3]"""
import argparse
import bisect
import collections
import datetime
import re


def read_trace(path):
    events, offset = [], 0
    for line in open(path, errors="replace"):
        parts = line.rstrip("\n").split(",")
        if len(parts) < 6:
            continue
        kind, name = parts[0], ",".join(parts[1:-4])
        if kind == "clock":
            cupti = int(parts[1].split("=")[1])
            real = int(parts[2].split("=")[1])
            offset = cupti - real
            continue
        try:
            start, end = int(parts[-4]), int(parts[-3])
        except ValueError:
            continue
        events.append((start, end, kind, name))
    events.sort()
    return events, offset


def rust_markers(path, target):
    stamp = re.compile(r"^(\S+Z)\s+TRACE\s+" + re.escape(target) + r":\s*(.*)$")
    out = []
    for line in open(path, errors="replace"):
        m = stamp.match(re.sub(r"\x1b\[[0-9;]*m", "", line.strip()))
        if not m:
            continue
        t = datetime.datetime.fromisoformat(m.group(1).replace("Z", "+00:00"))
        ns = int(t.timestamp()) * 1_000_000_000 + t.microsecond * 1000
        out.append((ns, m.group(2)))
    return out


def plain_markers(path):
    out = []
    for line in open(path):
        label, _, ns = line.rstrip("\n").rpartition(" ")
        if label:
            out.append((int(ns), label))
    return out


def union_ms(intervals, lo, hi):
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted((max(s, lo), min(e, hi)) for s, e in intervals if e > lo and s < hi):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total / 1e6


def gaps(device, lo, hi, n):
    """The n longest stretches of [lo, hi] with nothing on the GPU."""
    spans, at = [], lo
    for s, e in sorted(device):
        if e <= lo or s >= hi:
            continue
        if s > at:
            spans.append((s - at, at, s))
        at = max(at, e)
    if hi > at:
        spans.append((hi - at, at, hi))
    return sorted(spans, reverse=True)[:n]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--rust-log")
    ap.add_argument("--target", default="host_engine::step")
    ap.add_argument("--markers")
    ap.add_argument("--after")
    ap.add_argument("--back", type=int, default=0)
    ap.add_argument("--last", type=int)
    ap.add_argument("--gaps", type=int, default=3)
    ap.add_argument("--top-api", type=int, default=5)
    ap.add_argument("--kernels", type=int, default=0, help="with --last: the N kernels taking most GPU time, by name")
    a = ap.parse_args()
    events, offset = read_trace(a.trace)
    marks = rust_markers(a.rust_log, a.target) if a.rust_log else plain_markers(a.markers)
    marks = [(ns + offset, label) for ns, label in marks]
    if a.after:
        last = max(i for i, (_, label) in enumerate(marks) if a.after in label)
        marks = marks[max(0, last - a.back) :]
    if a.last:
        marks = marks[-(a.last + 1) :]
    device = [(s, e) for s, e, k, _ in events if k in ("kernel", "memcpy", "memset")]
    api = [(s, e, n) for s, e, k, n in events if k in ("driver", "runtime")]
    starts = [s for s, _, _ in api]
    print("| stretch ending at | wall ms | GPU busy ms | kernels | host API calls taking most time (ms) |")
    print("|---|---|---|---|---|")
    details = []
    # Every stretch's host API calls by name: (calls, ms).
    calls = collections.defaultdict(lambda: [0, 0.0])
    for (lo, _), (hi, label) in zip(marks, marks[1:]):
        kernels = sum(1 for s, e, k, _ in events if k == "kernel" and lo <= s < hi)
        by_name = collections.defaultdict(float)
        for s, e, n in api[bisect.bisect_left(starts, lo - 10**9) : bisect.bisect_left(starts, hi)]:
            if e > lo:
                by_name[n] += (min(e, hi) - max(s, lo)) / 1e6
                if s >= lo:
                    calls[n][0] += 1
                    calls[n][1] += (min(e, hi) - s) / 1e6
        top = ", ".join(f"{n} {ms:.1f}" for n, ms in sorted(by_name.items(), key=lambda x: -x[1])[: a.top_api])
        print(f"| {label[:70]} | {(hi - lo) / 1e6:.1f} | {union_ms(device, lo, hi):.1f} | {kernels} | {top} |")
        details.append((label, lo, hi))
    if details:
        n = len(details)
        wall = sum(hi - lo for _, lo, hi in details) / n / 1e6
        busy = sum(union_ms(device, lo, hi) for _, lo, hi in details) / n
        print(f"| mean of {n} | {wall:.2f} | {busy:.2f} | | |")
    print()
    if a.last:
        n = max(len(details), 1)
        print("| host API call | calls per stretch | ms per stretch |")
        print("|---|---|---|")
        for name, (count, ms) in sorted(calls.items(), key=lambda x: -x[1][1])[: a.top_api * 2]:
            print(f"| {name} | {count / n:.1f} | {ms / n:.3f} |")
        print()
        if a.kernels and details:
            lo, hi = details[0][1], details[-1][2]
            by_kernel = collections.defaultdict(lambda: [0, 0.0])
            for s, e, k, name in events:
                if k == "kernel" and lo <= s < hi:
                    by_kernel[name[:90]][0] += 1
                    by_kernel[name[:90]][1] += (e - s) / 1e6
            total = sum(ms for _, ms in by_kernel.values())
            print(f"| kernel (all: {total / n:.3f} ms per stretch) | launches per stretch | ms per stretch |")
            print("|---|---|---|")
            for name, (count, ms) in sorted(by_kernel.items(), key=lambda x: -x[1][1])[: a.kernels]:
                print(f"| {name} | {count / n:.1f} | {ms / n:.3f} |")
            print()
        return
    for label, lo, hi in details:
        print(f"## {label[:90]}: longest GPU idle gaps")
        for dur, s, e in gaps(device, lo, hi, a.gaps):
            under = collections.defaultdict(float)
            for cs, ce, n in api[bisect.bisect_left(starts, s - 10**9) : bisect.bisect_left(starts, e)]:
                if ce > s:
                    under[n] += (min(ce, e) - max(cs, s)) / 1e6
            calls = ", ".join(f"{n} {ms:.1f}" for n, ms in sorted(under.items(), key=lambda x: -x[1])[:4])
            print(f"- {dur / 1e6:.1f} ms at +{(s - lo) / 1e6:.1f}: {calls or 'no API call (host work)'}")
        print()


if __name__ == "__main__":
    main()
