#!/usr/bin/env python3
"""Counts the primitives of MLX graphs written as DOT: the files
`MLX_ENGINE_DUMP_GRAPHS=DIR host generate ...` writes (each serial plain
step's graph as NNNNN_step.dot, each speculative verify's as
NNNNN_verify.dot, just before MLX evaluates it). Prints the number of
graphs, their node counts, then the median count per primitive.

    python3 tests/bench/graph_census.py DIR/*_step.dot [--top 30]
"""
import argparse
import collections
import re
import statistics

NODE = re.compile(r'\[label ="([^"]+)", shape=rectangle\]')


def census(path):
    with open(path) as f:
        return collections.Counter(NODE.findall(f.read()))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    counts = [census(p) for p in a.files]
    totals = [sum(c.values()) for c in counts]
    print(f"{len(counts)} graphs, primitives per graph: median {statistics.median(totals)}, min {min(totals)}, max {max(totals)}")
    labels = collections.Counter()
    for c in counts:
        labels.update(c)
    rows = sorted(labels, key=lambda k: -labels[k])[: a.top]
    for k in rows:
        print(f"{statistics.median(c.get(k, 0) for c in counts):8.1f}  {k}")


if __name__ == "__main__":
    main()
