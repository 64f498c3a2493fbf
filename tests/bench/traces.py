"""Summarises the host's trace events (`RUST_LOG=host_engine=trace` on
`host generate` or `host serve`, written to stderr in tracing's default
format, one event a line:

  2026-12-01T15:02:15.719358Z TRACE host_engine::spec: speculative round width=3 accepted=1 draft_ms=0.0042 build_ms=3.21 wait_ms=9.60

Targets and events (host/host-engine/src):
  host_engine::spec   "speculative round" width accepted draft_ms build_ms launch_ms wait_ms
                      (build_ms: building and launching the verify graph after
                      drafting, launch_ms of it in MLX's async_eval; wait_ms:
                      waiting for the device's verdict)
                      "plain sample" intervals ms (the cost rule's timed plain steps)
  host_engine::step   "plain step" graph_ms launch_ms
  host_engine::batch  "batched plain step" rows leaving pipelined build_ms wait_ms ms
                      (build_ms: building and queueing this step's graph and,
                      pipelined, the next one's; wait_ms: waiting for the tokens)
                      "prefill chunk" joiners rows ms (one joiner's or cohort's chunk)
                      "batched speculative step" rows width ms cost drafted
                      "batched speculative step kept" kept

Usage: traces.py FILE [--target host_engine::spec] [--event "speculative round"]
                 [--last N] [--stat median|mean] [--fields draft_ms,build_ms,wait_ms]
                 [--where "leaving>0"] [--where "pipelined=true"]
Prints, for the matching events (the last N when given; `--where` keeps those
whose field compares so: `=`, `>` or `<`, numbers compared as numbers), each numeric field's
median or mean, min and max, and the most common width when there is one.
`--by-event` instead prints, per event of the target, its count and the sum
of its `ms` field (the batched trace's time per step kind).
"""
import argparse
import collections
import re
import statistics
import sys

LINE = re.compile(r"^\S+\s+TRACE\s+(?P<target>[\w:]+):\s+(?P<rest>.*)$")
FIELD = re.compile(r"(\w+)=(\[[^\]]*\]|Some\([^)]*\)|\"[^\"]*\"|\S+)")


def parse(path):
    """Yields (target, event, fields) for every trace line of the file."""
    ansi = re.compile(r"\x1b\[[0-9;]*m")
    for raw in open(path, errors="replace"):
        m = LINE.match(ansi.sub("", raw.rstrip("\n")))
        if not m:
            continue
        rest = m.group("rest")
        first = FIELD.search(rest)
        event = (rest[: first.start()] if first else rest).strip()
        yield m.group("target"), event, dict(FIELD.findall(rest))


def number(v):
    v = v[5:-1] if v.startswith("Some(") else v
    try:
        return float(v)
    except ValueError:
        return None


WHERE = re.compile(r"^(\w+)([=<>])(.+)$")


def holds(fields, cond):
    """Whether an event's fields satisfy one `--where` condition."""
    key, op, want = WHERE.match(cond).groups()
    if key not in fields:
        return False
    have, x, y = fields[key], number(fields[key]), number(want)
    if op == "=":
        return x == y if x is not None and y is not None else have == want
    if x is None or y is None:
        return False
    return x > y if op == ">" else x < y


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--target", default="host_engine::spec")
    ap.add_argument("--event", default=None, help="the event's message (default: every event of the target)")
    ap.add_argument("--last", type=int, default=0)
    ap.add_argument("--stat", choices=("median", "mean"), default="median")
    ap.add_argument("--fields", default=None, help="comma-separated; default: every numeric field")
    ap.add_argument("--by-event", action="store_true")
    ap.add_argument("--where", action="append", default=[], help="FIELD=V, FIELD>N or FIELD<N (repeatable)")
    a = ap.parse_args()
    for cond in a.where:
        if not WHERE.match(cond):
            sys.exit(f"--where {cond!r}: expected FIELD=V, FIELD>N or FIELD<N")
    rows = [
        (e, f)
        for t, e, f in parse(a.file)
        if t == a.target and (a.event is None or e == a.event) and all(holds(f, c) for c in a.where)
    ]
    if a.last:
        rows = rows[-a.last:]
    if not rows:
        sys.exit(f"no {a.target} events{' ' + repr(a.event) if a.event else ''} in {a.file} (was RUST_LOG=host_engine=trace set?)")
    if a.by_event:
        count, ms = collections.Counter(), collections.Counter()
        for e, f in rows:
            count[e] += 1
            ms[e] += number(f.get("ms", "0")) or 0.0
        for e in count:
            print(f"{e}: {count[e]} events, {ms[e]:.1f} ms")
        return
    keys = a.fields.split(",") if a.fields else [k for k, v in rows[-1][1].items() if number(v) is not None]
    stat = statistics.median if a.stat == "median" else statistics.mean
    out = []
    for k in keys:
        vals = [x for x in (number(f[k]) for _, f in rows if k in f) if x is not None]
        if vals:
            out.append(f"{k} {a.stat} {stat(vals):.2f} (min {min(vals):.2f}, max {max(vals):.2f})")
    widths = [f["width"] for _, f in rows if "width" in f]
    if widths:
        out.append(f"width mostly {statistics.mode(widths)}")
    print(f"{len(rows)} events: " + "; ".join(out))


if __name__ == "__main__":
    main()
