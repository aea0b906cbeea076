#!/usr/bin/env python3
"""Checks a merged troupe trace (docs/tracing.md): check_trace.py FILE WORLD_SIZE.

It must parse as trace-event JSON; every rank has events; every RPC client span has a flow
arrow to a server span on the callee, which after clock alignment lies inside the client
span (within the recorded uncertainties); so does every remote-reference fetch, to the
owner's "serve rref fetch" span; every collective appears on every member with the same
sequence numbers; troupe-run's spawn and exit events are there. Exits non-zero, saying
what is wrong, otherwise.

load() and check_flows() serve the other trace checks too (tests/actors).
"""
import json
import sys
from collections import defaultdict


def fail(msg):
    print("trace check failed: " + msg)
    sys.exit(1)


def load(path, world):
    """The events of merged trace `path` (checked to be trace-event JSON with spans on
    every rank), and each rank's clock uncertainty in microseconds."""
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
    return events, unc


def check_flows(events, unc, clients, is_server, same, nested=True):
    """Every span of `clients` starts a flow arrow that ends at the start of a span on the
    rank its `peer` names, for which is_server(span) holds and same(client, server) is
    true; with `nested`, that span lies inside the client's after clock alignment (within
    both ranks' uncertainties). Returns the server spans reached."""
    spans = [e for e in events if e["ph"] == "X"]
    by_start = {(e["pid"], e["tid"], e["ts"]): e for e in spans}
    flow_out = {}
    flow_in = {}
    for e in events:
        if e["ph"] == "s":
            flow_out.setdefault((e["pid"], e["tid"], e["ts"]), []).append(e)
        elif e["ph"] == "f":
            if e["id"] in flow_in:
                fail(f"two flow arrows end with id {e['id']}")
            flow_in[e["id"]] = e
    reached = []
    for c in clients:
        outs = flow_out.get((c["pid"], c["tid"], c["ts"]), [])
        if not outs:
            fail(f"{c['cat']} span without a flow: {c}")
        found = None
        for s in outs:
            f = flow_in.get(s["id"])
            if f is None:
                continue
            srv = by_start.get((f["pid"], f["tid"], f["ts"]))
            if srv is not None and is_server(srv):
                found = srv
        if found is None:
            fail(f"the flow of {c['name']} on rank {c['pid']} reaches no matching span: {c}")
        srv = found
        callee = int(c["args"]["peer"].removeprefix("worker"))
        if srv["pid"] != callee:
            fail(f"{c['name']} to {c['args']['peer']} arrived on rank {srv['pid']}")
        if not same(c, srv):
            fail(f"{c['name']} on rank {c['pid']} and {srv['name']} on rank {srv['pid']} disagree: "
                 f"{c['args']} vs {srv['args']}")
        tol = unc[c["pid"]] + unc[srv["pid"]] + 0.002
        if nested and (srv["ts"] < c["ts"] - tol or srv["ts"] + srv["dur"] > c["ts"] + c["dur"] + tol):
            fail(f"{srv['name']} {srv['ts']}+{srv['dur']} (rank {srv['pid']}) is not inside "
                 f"{c['name']} {c['ts']}+{c['dur']} (rank {c['pid']}), tolerance {tol} us")
        reached.append(srv)
    return reached


def main():
    path, world = sys.argv[1], int(sys.argv[2])
    events, unc = load(path, world)
    spans = [e for e in events if e["ph"] == "X"]

    clients = [e for e in spans if e.get("cat") == "rpc" and e["name"].startswith("call ")]
    servers = [e for e in spans if e.get("cat") == "rpc" and e["name"].startswith("serve ")
               and e["name"] != "serve rref fetch"]
    if len(clients) < world or len(servers) < world:
        fail(f"{len(clients)} client and {len(servers)} server spans for {world} ranks")
    check_flows(events, unc, clients,
                lambda s: s.get("cat") == "rpc" and s["name"].startswith("serve "),
                lambda c, s: c["args"]["function"] == s["args"]["function"])

    # Remote references: each rank fetches one owned by the next rank.
    fetches = [e for e in spans if e.get("cat") == "rpc" and e["name"] == "rref fetch"]
    if {e["pid"] for e in fetches} != set(range(world)):
        fail(f"remote-reference fetches only on ranks {sorted({e['pid'] for e in fetches})}")
    for e in fetches:
        if "error" in e["args"] or e["args"].get("reply_bytes", 0) <= 0:
            fail(f"a fetch without its value: {e}")
    check_flows(events, unc, fetches, lambda s: s["name"] == "serve rref fetch",
                lambda c, s: c["args"]["rref"] == s["args"]["rref"] and s["args"]["bytes"] > 0)

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
    print(f"trace ok: {len(events)} events, {len(clients)} calls, {len(fetches)} fetches, "
          f"{len(colls)} collectives, "
          f"uncertainty up to {max(unc.values()):.1f} us")


if __name__ == "__main__":
    main()
