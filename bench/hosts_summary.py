#!/usr/bin/python3
"""The table of bench/hosts_bench.sh: medians over its rounds, ratios and targets.

Reads DIR/{troupe_rpc,lowlat_rpc,anchor_rpc,troupe_coll,flat_coll,anchor_coll,mpi_coll}.jsonl
(the JSON lines of rpc_bench, rpc_bench --inline --busy-poll-us 50, rpc_torch.py,
collectives_bench --json, the same with TROUPE_GLOO_HIERARCHICAL=0,
collectives_torch_gloo.py and mpi_collectives_bench, one set per round) and prints a markdown table: troupe, the anchor, troupe/anchor, the target and
whether it is met, with each median's range over the rounds.
Usage: /usr/bin/python3 bench/hosts_summary.py DIR
"""
import json
import statistics
import sys
from pathlib import Path


def load(d, name):
    p = Path(d) / f"{name}.jsonl"
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text().splitlines() if line.startswith("{")]


def values(rows, fig, **match):
    return [r[fig] for r in rows if fig in r and all(r.get(k) == v for k, v in match.items())]


def fmt(v):
    return f"{v:,.1f}" if abs(v) >= 100 else f"{v:.3g}"


def cell(vs):
    if not vs:
        return "n/a"
    m = statistics.median(vs)
    return f"{fmt(m)} ({fmt(min(vs))}..{fmt(max(vs))})" if len(vs) > 1 else fmt(m)


def row(what, t, a, anchor_name, target=None):
    """target: ("<=", x) or (">=", x) on troupe/anchor; None for a figure without one."""
    if not t or not a:
        print(f"| {what} | {cell(t)} | {anchor_name}: {cell(a)} | n/a | {target or ''} | no data |")
        return
    ratio = statistics.median(t) / statistics.median(a)
    if target is None:
        verdict, tgt = "", ""
    else:
        op, x = target
        met = ratio <= x if op == "<=" else ratio >= x
        verdict, tgt = ("met" if met else "not met"), f"{op} {x}x"
    print(f"| {what} | {cell(t)} | {anchor_name}: {cell(a)} | {ratio:.2f} | {tgt} | {verdict} |")


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: hosts_summary.py DIR (the results of bench/hosts_bench.sh)")
    d = sys.argv[1]
    trpc, arpc, lrpc = load(d, "troupe_rpc"), load(d, "anchor_rpc"), load(d, "lowlat_rpc")
    tcol, acol, fcol = load(d, "troupe_coll"), load(d, "anchor_coll"), load(d, "flat_coll")
    mcol = load(d, "mpi_coll")
    print("| measurement | troupe, median (range) | anchor, median (range) | troupe/anchor | target | |")
    print("|---|---|---|---|---|---|")
    rpc_p50 = values(trpc, "p50_us", bench="roundtrip", variant="rpc")
    raw_p50 = values(trpc, "p50_us", bench="roundtrip", variant="raw_tcp")
    tp_p50 = values(arpc, "p50_us", bench="roundtrip", variant="rpc")
    row("RPC no-op p50 (us)", rpc_p50, raw_p50, "raw TCP", ("<=", 1.2))
    row("RPC no-op p50 (us)", rpc_p50, tp_p50, "TensorPipe", ("<=", 0.35))
    low_p50 = values(lrpc, "p50_us", bench="roundtrip", variant="rpc")
    low_raw = values(lrpc, "p50_us", bench="roundtrip", variant="raw_tcp")
    row("RPC no-op p50, --inline --busy-poll-us 50 (us)", low_p50, low_raw, "raw TCP", ("<=", 1.2))
    row("RPC no-op p50, --inline --busy-poll-us 50 (us)", low_p50, tp_p50, "TensorPipe", ("<=", 0.35))
    row("RPC no-op p99 (us)", values(trpc, "p99_us", bench="roundtrip", variant="rpc"),
        values(arpc, "p99_us", bench="roundtrip", variant="rpc"), "TensorPipe")
    row("RPC no-op, 64 in flight (calls/s)", values(trpc, "calls_per_s", bench="async"),
        values(arpc, "calls_per_s", bench="async"), "TensorPipe")
    sizes = sorted({r["bytes"] for r in trpc if r.get("bench") == "echo"})
    for b in sizes:
        mib = f"{b / (1 << 20):g} MiB"
        t = values(trpc, "GBps", bench="echo", variant="rpc", bytes=b)
        target = (">=", 0.9) if b == 16 << 20 else None
        row(f"echo {mib} (GB/s)", t, values(trpc, "GBps", bench="echo", variant="raw_tcp", bytes=b),
            "raw TCP", target)
        row(f"echo {mib} (GB/s)", t, values(arpc, "GBps", bench="echo", variant="rpc", bytes=b),
            "TensorPipe")
    for b in sorted({r["bytes"] for r in tcol if r.get("bench") == "allreduce"}):
        size = f"{b / (1 << 20):g} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"
        target = (">=", 1.5) if b >= 1 << 20 else None
        row(f"allreduce busbw, world 4, {size} (GB/s)",
            values(tcol, "busbw_GBps", bench="allreduce", bytes=b),
            values(acol, "busbw_GBps", bench="allreduce", bytes=b), "torch-gloo", target)
    for b in sorted({r["bytes"] for r in mcol if r.get("bench") == "allreduce"}):
        size = f"{b / (1 << 20):g} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"
        target = ("<=", 1.0) if b >= 1 << 20 else None
        row(f"allreduce time, world 4, {size} (us)",
            values(tcol, "time_us", bench="allreduce", bytes=b),
            values(mcol, "time_us", bench="allreduce", bytes=b), "Open MPI (TCP between hosts)",
            target)
    for b in sorted({r["bytes"] for r in fcol if r.get("bench") == "allreduce"}):
        size = f"{b / (1 << 20):g} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"
        row(f"allreduce busbw, flat path (TROUPE_GLOO_HIERARCHICAL=0), {size} (GB/s)",
            values(fcol, "busbw_GBps", bench="allreduce", bytes=b),
            values(acol, "busbw_GBps", bench="allreduce", bytes=b), "torch-gloo")
    for b in sorted({r["bytes"] for r in tcol if r.get("bench") == "allreduce_hier"}):
        size = f"{b / (1 << 20):g} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"
        row(f"allreduce busbw, two-level prototype, {size} (GB/s)",
            values(tcol, "busbw_GBps", bench="allreduce_hier", bytes=b),
            values(acol, "busbw_GBps", bench="allreduce", bytes=b), "torch-gloo")


if __name__ == "__main__":
    sys.exit(main())
