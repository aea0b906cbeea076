#!/usr/bin/python3
"""What the trace sites cost (docs/tracing.md, "Cost"): runs rpc_bench and collectives_bench
from three builds, alternating, several times in one run, and prints the medians and the
ratios against the build without sites.

  no sites  a build configured with -DTROUPE_TRACE_SITES=OFF (--nosites, default build/notrace)
  off       the normal build (--sites, default build/release), TROUPE_TRACE unset
  on        the normal build with TROUPE_TRACE set (a fresh directory for every run)

Usage (from the repository root):
  /usr/bin/python3 bench/trace_overhead.py --runs 7
Each run starts the three variants in a rotated order, so that none always goes first. The
figures: rpc_bench's no-op roundtrip (p50 and p99, µs) and 64-in-flight async calls
(calls/s); collectives_bench's allreduce at --small and --medium bytes (time per op, µs),
world 2 over shared memory. The raw TCP roundtrip, which nothing traces, is printed as a
measure of the machine's noise. Exits non-zero (naming the command) when a program fails.
"""
import argparse
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
import json

VARIANTS = ("no sites", "off", "on")


def run(cmd, env):
    try:
        p = subprocess.run(shlex.split(cmd), capture_output=True, text=True, timeout=600, env=env)
    except subprocess.TimeoutExpired:
        sys.exit(f"trace_overhead: '{cmd}' ran past 600 s")
    if p.returncode != 0:
        sys.exit(f"trace_overhead: '{cmd}' failed with exit code {p.returncode}:\n{p.stderr[-2000:]}")
    return [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]


def rows_of(rpc_rows, coll_rows, small, medium):
    """(measurement, figure) -> value for the rows this report compares."""
    out = {}
    for r in rpc_rows:
        if r["bench"] == "roundtrip":
            what = "RPC no-op roundtrip" if r["variant"] == "rpc" else "raw TCP roundtrip (never traced)"
            out[(what, "p50 µs")] = r["p50_us"]
            out[(what, "p99 µs")] = r["p99_us"]
        elif r["bench"] == "async":
            out[("RPC async, 64 in flight", "calls/s")] = r["calls_per_s"]
    for r in coll_rows:
        if r["bench"] == "allreduce" and r["bytes"] in (small, medium):
            out[(f"allreduce {r['bytes']} B, world {r['world']}", "µs per op")] = r["time_us"]
    return out


def fmt(v):
    return f"{v:,.1f}" if abs(v) >= 100 else f"{v:.3g}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--nosites", default="build/notrace", help="build tree without trace sites")
    ap.add_argument("--sites", default="build/release", help="build tree with trace sites")
    ap.add_argument("--small", type=int, default=4096, help="small allreduce, bytes")
    ap.add_argument("--medium", type=int, default=1 << 20, help="medium allreduce, bytes")
    ap.add_argument("--rpc-args", default="--iters 3000 --seconds 1 --sizes 4096")
    a = ap.parse_args()
    if a.runs < 1:
        sys.exit("trace_overhead: --runs needs a positive count")
    if a.small <= 0 or a.medium < a.small:
        sys.exit("trace_overhead: --small must be positive and --medium at least --small")
    for tree in (a.nosites, a.sites):
        for prog in ("rpc_bench", "collectives_bench"):
            if not os.access(os.path.join(tree, "bench", prog), os.X_OK):
                sys.exit(f"trace_overhead: {tree}/bench/{prog} is missing; build it first "
                         f"(docs/tracing.md, \"Cost\")")
    coll_args = f"--world 2 --json --ops allreduce --min {a.small} --max {a.medium}"
    trace_dir = tempfile.mkdtemp(prefix="troupe-trace-overhead-")
    base = {k: v for k, v in os.environ.items() if k != "TROUPE_TRACE"}
    setups = {"no sites": (a.nosites, base), "off": (a.sites, base),
              "on": (a.sites, dict(base, TROUPE_TRACE=os.path.join(trace_dir, "t")))}
    samples = defaultdict(list)  # (variant, measurement, figure) -> values
    try:
        for i in range(a.runs):
            order = VARIANTS[i % 3:] + VARIANTS[:i % 3]
            for v in order:
                tree, env = setups[v]
                shutil.rmtree(os.path.join(trace_dir, "t"), ignore_errors=True)
                rpc = run(f"{tree}/bench/rpc_bench {a.rpc_args}", env)
                coll = run(f"{tree}/bench/collectives_bench {coll_args}", env)
                for key, value in rows_of(rpc, coll, a.small, a.medium).items():
                    samples[(v,) + key].append(value)
            print(f"run {i + 1}/{a.runs} done", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(trace_dir, ignore_errors=True)

    load = os.getloadavg()
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {platform.node()}, "
          f"{os.cpu_count()} cores, load average {load[0]:.1f} at the end; median of {a.runs} runs")
    print(f"# /usr/bin/python3 bench/trace_overhead.py {' '.join(shlex.quote(x) for x in sys.argv[1:])}")
    print(f"#   rpc_bench {a.rpc_args}; collectives_bench {coll_args}")
    print("| measurement | figure | no sites | off | on | off/no sites | on/no sites |")
    print("|---|---|---|---|---|---|---|")
    keys = sorted({k[1:] for k in samples})
    for key in keys:
        med = {v: statistics.median(samples[(v,) + key]) for v in VARIANTS if samples.get((v,) + key)}
        if len(med) < 3:
            continue
        n = med["no sites"]
        print(f"| {key[0]} | {key[1]} | {fmt(n)} | {fmt(med['off'])} | {fmt(med['on'])} | "
              f"{med['off'] / n:.3f} | {med['on'] / n:.3f} |")
    print("# spread (max/min over the runs) of the no-sites build, a measure of the noise:")
    for key in keys:
        s = samples.get(("no sites",) + key)
        if s and min(s) > 0:
            print(f"#   {key[0]}, {key[1]}: {max(s) / min(s):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
