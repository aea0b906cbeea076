#!/usr/bin/python3
"""Runs a troupe benchmark and its PyTorch anchor alternately, several times, in one run,
and prints the medians side by side with ratios (troupe / anchor).

Both programs print one JSON object per measurement with keys impl, bench, a size key
(clients, bytes, ...) and figures. Usage:
  /usr/bin/python3 bench/compare.py --runs 5 \
      --troupe "build/release/bench/store_bench --clients 1,8,32" \
      --anchor "/usr/bin/python3 bench/store_c10d.py --clients 1,8,32"
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
    a = ap.parse_args()
    label_t, label_a = a.labels.split(",")
    samples = defaultdict(list)  # (impl, key, figure) -> values
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


if __name__ == "__main__":
    sys.exit(main())
