#!/usr/bin/python3
"""Runs a troupe benchmark and its PyTorch anchor alternately, several times, in one run,
and prints the medians side by side with ratios (troupe / anchor).

Both programs print one JSON object per measurement with keys impl, bench, a size key
(clients, bytes, ...) and figures. Usage:
  /usr/bin/python3 bench/compare.py --runs 5 \
      --troupe "build/release/bench/store_bench --clients 1,8,32" \
      --anchor "/usr/bin/python3 bench/store_c10d.py --clients 1,8,32"

--pairs FIGURE adds a table for that figure (e.g. time_us) that sets each troupe run beside
the anchor run right after it: the median of those runs' ratios, their quartiles, and how
many of the pairs troupe won (the smaller figure). On a machine whose speed moves within
seconds, the pairs show what the medians of the two sides cannot: whether a ratio near 1.0
is one side ahead in most pairs or a toss-up.
"""
import argparse
import json
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections import defaultdict


def run(cmd):
    out = subprocess.run(shlex.split(cmd), check=True, capture_output=True, text=True,
                         timeout=900).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def key_of(row):
    return tuple((k, row[k]) for k in sorted(row) if k not in ("impl",) and
                 not isinstance(row[k], float))


def fmt(v):
    return f"{v:,.1f}" if abs(v) >= 100 else f"{v:.4g}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--troupe", required=True)
    ap.add_argument("--anchor", required=True)
    ap.add_argument("--labels", default="troupe,anchor",
                    help="column names of the two programs, e.g. now,before for an A/B run")
    ap.add_argument("--pairs", metavar="FIGURE",
                    help="also compare each run with the anchor's next run on this figure "
                         "(smaller is better, e.g. time_us)")
    a = ap.parse_args()
    label_t, label_a = a.labels.split(",")
    samples = defaultdict(list)  # (impl, key, figure) -> values
    if a.runs < 1:
        ap.error(f"--runs must be at least 1, not {a.runs}")
    for i in range(a.runs):
        for impl, cmd in (("troupe", a.troupe), ("anchor", a.anchor)):
            for row in run(cmd):
                for fig, v in row.items():
                    if isinstance(v, float):
                        samples[(impl, key_of(row), fig)].append(v)
        print(f"run {i + 1}/{a.runs} done", file=sys.stderr, flush=True)

    print(f"# {time.strftime('%Y-%m-%d')} on {platform.node()} ({platform.processor() or platform.machine()}),"
          f" median of {a.runs} runs")
    print(f"# {label_t}: {a.troupe}")
    print(f"# {label_a}: {a.anchor}")
    print(f"| measurement | figure | {label_t} | {label_a} | {label_t}/{label_a} |")
    print("|---|---|---|---|---|")
    for (impl, key, fig) in sorted(k for k in samples if k[0] == "troupe"):
        t = statistics.median(samples[(impl, key, fig)])
        other = samples.get(("anchor", key, fig))
        if not other:
            continue
        o = statistics.median(other)
        label = ", ".join(f"{k}={v}" for k, v in key)
        # A figure that is 0 on the anchor's side (bus bandwidth of a group of one) has no ratio.
        ratio = f"{t / o:.2f}" if o else "n/a"
        print(f"| {label} | {fig} | {fmt(t)} | {fmt(o)} | {ratio} |")
    if a.pairs:
        print_pairs(samples, a.pairs, label_t, label_a, a.runs)


def print_pairs(samples, fig, label_t, label_a, runs):
    """Run i of troupe against run i of the anchor (the one right after it), per key."""
    print()
    print(f"| measurement | {fig}: {label_t}/{label_a}, median of the pairs | quartiles |"
          f" pairs {label_t} won |")
    print("|---|---|---|---|")
    keys = sorted(k[1] for k in samples if k[0] == "troupe" and k[2] == fig)
    if not keys:
        print(f"| no figure named {fig} in the troupe runs | | | |")
    for key in keys:
        t = samples[("troupe", key, fig)]
        o = samples.get(("anchor", key, fig), [])
        # A program that printed a key in some runs only cannot be paired run by run.
        if len(t) != runs or len(o) != runs:
            print(f"| {', '.join(f'{k}={v}' for k, v in key)} | unpaired ({len(t)} and"
                  f" {len(o)} of {runs} runs) | | |")
            continue
        ratios = sorted(x / y for x, y in zip(t, o) if y)
        if not ratios:
            continue
        q = statistics.quantiles(ratios, n=4) if len(ratios) >= 2 else [ratios[0]] * 3
        won = sum(1 for x, y in zip(t, o) if x < y)
        label = ", ".join(f"{k}={v}" for k, v in key)
        print(f"| {label} | {statistics.median(ratios):.2f} | {q[0]:.2f}-{q[2]:.2f} |"
              f" {won} of {len(ratios)} |")


if __name__ == "__main__":
    sys.exit(main())
