#!/usr/bin/env python3
"""Checks a merged troupe trace (docs/tracing.md): check_trace.py FILE WORLD_SIZE.

It must parse as trace-event JSON; every rank has events; every RPC client span has a flow
arrow to a server span on the callee, which after clock alignment lies inside the client
span (within the recorded uncertainties); every collective appears on every member with
the same sequence numbers; troupe-run's spawn and exit events are there. Exits non-zero,
saying what is wrong, otherwise.
"""
import json
import sys
from collections import defaultdict


def fail(msg):
    print("trace check failed: " + msg)
    sys.exit(1)


def main():
    path, world = sys.argv[1], int(sys.argv[2])
    with open(path) as f:
        doc = json.load(f)
    events = doc["traceEvents"]
    if not events:
        fail("no events")
    for e in events:
        for key in ("ph", "ts", "pid", "tid"):
            if key not in e:
                fail(f"event without {key}: {e}")
    spans = [e for e in events if e["ph"] == "X"]
    for r in range(world):
        if not any(e["pid"] == r for e in spans):
            fail(f"rank {r} has no spans")

    # Clock offsets and their uncertainty, per rank (microseconds).
    unc = defaultdict(float)
    clocks = [e for e in events if e["ph"] == "M" and e["name"] == "troupe_clock_applied"]
    for e in clocks:
        u = e["args"]["uncertainty_ns"]
        if u < 0:
            fail(f"rank {e['pid']} did not measure its clock")
        unc[e["pid"]] = u / 1000.0
    if len({e["pid"] for e in clocks}) < world:
        fail(f"only {len(clocks)} ranks recorded a clock offset")

    by_start = {(e["pid"], e["tid"], e["ts"]): e for e in spans}
    flow_out = {}
    flow_in = {}
    for e in events:
        if e["ph"] == "s":
            flow_out[e["id"]] = e
        elif e["ph"] == "f":
            flow_in[e["id"]] = e

    clients = [e for e in spans if e.get("cat") == "rpc" and e["name"].startswith("call ")]
    servers = [e for e in spans if e.get("cat") == "rpc" and e["name"].startswith("serve ")]
    if len(clients) < world or len(servers) < world:
        fail(f"{len(clients)} client and {len(servers)} server spans for {world} ranks")
    starts = {(e["pid"], e["tid"], e["ts"]): e for e in flow_out.values()}
    for c in clients:
        s = starts.get((c["pid"], c["tid"], c["ts"]))
        if s is None:
            fail(f"client span without a flow: {c}")
        f = flow_in.get(s["id"])
        if f is None:
            fail(f"flow {s['id']} of {c['name']} on rank {c['pid']} reaches no server")
        srv = by_start.get((f["pid"], f["tid"], f["ts"]))
        if srv is None or not srv["name"].startswith("serve "):
            fail(f"flow {s['id']} ends outside a server span")
        callee = int(c["args"]["peer"].removeprefix("worker"))
        if srv["pid"] != callee:
            fail(f"call to {c['args']['peer']} served on rank {srv['pid']}")
        if srv["args"]["function"] != c["args"]["function"]:
            fail("client and server name different functions")
        tol = unc[c["pid"]] + unc[srv["pid"]] + 0.002
        if srv["ts"] < c["ts"] - tol or srv["ts"] + srv["dur"] > c["ts"] + c["dur"] + tol:
            fail(f"server span {srv['ts']}+{srv['dur']} (rank {srv['pid']}) is not inside client "
                 f"span {c['ts']}+{c['dur']} (rank {c['pid']}), tolerance {tol} us")

    colls = defaultdict(dict)
    for e in spans:
        if e.get("cat") == "collectives" and "seq" in e.get("args", {}):
            a = e["args"]
            colls[(a["group"], a["seq"])][e["pid"]] = e["name"]
    if not colls:
        fail("no collectives")
    for (group, seq), members in colls.items():
        if set(members) != set(range(world)):
            fail(f"collective #{seq} of group {group} only on ranks {sorted(members)}")
        if len(set(members.values())) != 1:
            fail(f"collective #{seq} of group {group} is {set(members.values())}")

    launcher = [e for e in events if e.get("cat") == "launcher"]
    spawned = {e["args"]["rank"] for e in launcher if e["name"] == "spawn"}
    exited = {e["args"]["rank"] for e in launcher if e["name"] == "exit"}
    if spawned != set(range(world)) or exited != set(range(world)):
        fail(f"launcher events: spawned {sorted(spawned)}, exited {sorted(exited)}")
    print(f"trace ok: {len(events)} events, {len(clients)} calls, {len(colls)} collectives, "
          f"uncertainty up to {max(unc.values()):.1f} us")


if __name__ == "__main__":
    main()
