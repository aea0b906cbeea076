#!/usr/bin/python3
"""Draws a merged troupe trace as a timeline picture, for docs and for a quick look without
a browser. One row per process (ranks, then troupe-run), one bar per span coloured by its
category, an arrow per RPC flow from the caller's span to the callee's, a tick per instant
event.

  /usr/bin/python3 scripts/trace_timeline.py TRACE.json OUT.png [--from MS] [--to MS]

TRACE.json is what troupe-run writes at the end of an attempt
(<TROUPE_TRACE>/troupe-trace-<run id>-attempt-<n>.json) or what troupe-trace-merge makes.
--from/--to pick a window in milliseconds after the first event (default: all of it).
Needs Debian's python3-matplotlib (apt-get install python3-matplotlib).
"""
import argparse
import json
import sys

COLOURS = {"rpc": "#4c72b0", "collectives": "#dd8452", "launcher": "#55a868"}


def load(path):
    with open(path) as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trace")
    p.add_argument("out")
    p.add_argument("--from", dest="start", type=float, default=None, help="window start, ms")
    p.add_argument("--to", dest="end", type=float, default=None, help="window end, ms")
    a = p.parse_args()
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("trace_timeline: needs matplotlib; apt-get install python3-matplotlib, and run "
                 "it with /usr/bin/python3")

    events = load(a.trace)
    names = {e["pid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    timed = [e for e in events if e.get("ph") in ("X", "i", "I", "s", "f")]
    if not timed:
        sys.exit(f"trace_timeline: {a.trace} holds no timed events")
    t0 = min(e["ts"] for e in timed)
    ms = lambda ts: (ts - t0) / 1000.0
    lo = a.start if a.start is not None else float("-inf")
    hi = a.end if a.end is not None else float("inf")

    def visible(e):
        start = ms(e["ts"])
        end = start + e.get("dur", 0) / 1000.0
        return end >= lo and start <= hi

    # Rows: ranks in order, then everything else (troupe-run).
    pids = sorted({e["pid"] for e in timed},
                  key=lambda pid: (not str(names.get(pid, "")).startswith("rank"), pid))
    row = {pid: i for i, pid in enumerate(pids)}
    fig, ax = plt.subplots(figsize=(12, 1.0 + 0.7 * len(pids)))
    for e in timed:
        if not visible(e):
            continue
        y = row[e["pid"]]
        if e["ph"] == "X":
            c = COLOURS.get(e.get("cat"), "#8172b2")
            # Server spans get a lane of their own under the row, so that they do not hide
            # behind the callee's own calls and collectives.
            serve = e["name"].startswith("serve")
            ax.barh(y + (0.32 if serve else -0.1), max(e.get("dur", 0) / 1000.0, 1e-3),
                    left=ms(e["ts"]), height=0.22 if serve else 0.5,
                    color="#8fb3de" if serve else c, edgecolor="black", linewidth=0.3)
        elif e["ph"] in ("i", "I"):
            ax.plot([ms(e["ts"])] * 2, [y - 0.4, y + 0.4], color="#c44e52", linewidth=1)
            ax.text(ms(e["ts"]), y + 0.42, e["name"], fontsize=7, color="#c44e52")
    starts = {(e.get("cat"), e["id"]): e for e in timed if e["ph"] == "s" and "id" in e}
    for e in timed:
        if e["ph"] != "f" or "id" not in e:
            continue
        s = starts.get((e.get("cat"), e["id"]))
        if s is None or not (visible(s) or visible(e)):
            continue
        ax.annotate("", xy=(ms(e["ts"]), row[e["pid"]] + 0.32), xytext=(ms(s["ts"]), row[s["pid"]] - 0.1),
                    arrowprops=dict(arrowstyle="->", color="#333333", linewidth=0.6))
    ax.set_yticks(range(len(pids)))
    ax.set_yticklabels([names.get(pid, f"pid {pid}") for pid in pids])
    ax.invert_yaxis()
    if a.start is not None or a.end is not None:
        ax.set_xlim(a.start, a.end)
    ax.set_xlabel("ms since the first event (clocks aligned to rank 0)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLOURS.values()]
    handles.append(plt.Rectangle((0, 0), 1, 1, color="#8fb3de"))
    ax.legend(handles, list(COLOURS) + ["rpc (served)"], loc="upper left",
              bbox_to_anchor=(1.0, 1.0), fontsize=8)
    ax.set_title(a.trace.rsplit("/", 1)[-1], fontsize=9)
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)
    print(f"trace_timeline: {len(timed)} events -> {a.out}")


if __name__ == "__main__":
    main()
