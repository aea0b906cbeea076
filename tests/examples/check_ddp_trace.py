"""Checks the merged trace of a traced train_demo job (DDP with a Join scope): every rank
recorded DDP steps with their buckets nested inside, as many Join waits as the others and a
clock offset measured through the store (the demo has no RPC agent), and troupe-run recorded
the rendezvous of the round.

  python3 check_ddp_trace.py MERGED_TRACE.json WORLD_SIZE
"""
import json
import sys


def fail(why):
    print("check_ddp_trace: " + why)
    sys.exit(1)


def main():
    path, world = sys.argv[1], int(sys.argv[2])
    with open(path) as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    spans = [e for e in events if e.get("ph") == "X"]
    join_counts = set()
    for rank in range(world):
        mine = [e for e in spans if e["pid"] == rank]
        steps = [e for e in mine if e.get("cat") == "ddp" and e["name"] == "step"]
        buckets = [e for e in mine if e.get("cat") == "ddp" and e["name"] == "bucket"]
        joins = [e for e in mine if e.get("cat") == "join" and e["name"] == "join"]
        if not steps:
            fail(f"rank {rank} recorded no DDP step")
        if not buckets:
            fail(f"rank {rank} recorded no DDP bucket")
        # One Join scope per epoch of data: every rank ends each of them once.
        join_counts.add(len(joins))
        if not joins:
            fail(f"rank {rank} recorded no Join wait")
        for b in buckets:
            if "bytes" not in b["args"] or b["args"]["bytes"] <= 0:
                fail(f"rank {rank}: a bucket without bytes: {b}")
            inside = [s for s in steps
                      if s["ts"] <= b["ts"] and b["ts"] + b["dur"] <= s["ts"] + s["dur"]]
            if not inside:
                fail(f"rank {rank}: bucket {b['args']} at {b['ts']} lies in no step")
        if any(s["args"].get("ok") != "yes" for s in steps):
            fail(f"rank {rank}: a step did not succeed")
    # The demo has no RPC agent: its clock offsets come from pings through the store.
    clocks = {e["pid"]: e["args"] for e in events
              if e.get("ph") == "M" and e.get("name") == "troupe_clock_applied"}
    for rank in range(1, world):
        how = clocks.get(rank, {}).get("how", "")
        if "store ping" not in how or clocks[rank].get("uncertainty_ns", -1) < 0:
            fail(f"rank {rank}'s clock was not measured through the store: {clocks.get(rank)}")
    if len(join_counts) != 1:
        fail(f"the ranks ended different numbers of Join scopes: {sorted(join_counts)}")
    rendezvous = [e for e in spans if e.get("cat") == "launcher" and e["name"] == "rendezvous"]
    if not rendezvous or rendezvous[0]["args"].get("world_size") != world:
        fail(f"troupe-run recorded no rendezvous of world {world}: {rendezvous}")
    print(f"check_ddp_trace: {world} ranks, "
          f"{sum(1 for e in spans if e.get('cat') == 'ddp' and e['name'] == 'bucket')} buckets "
          f"in their steps, {join_counts.pop()} Join waits each, the rendezvous recorded")


if __name__ == "__main__":
    main()
