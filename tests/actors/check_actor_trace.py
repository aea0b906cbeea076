#!/usr/bin/env python3
"""Checks a merged trace of actors_trace_worker (docs/tracing.md):
check_actor_trace.py FILE WORLD_SIZE REPEAT.

Every rank sent REPEAT plain messages and REPEAT + 1 requests to the next rank's actors and
received as many; each sender's span ("send <actor>", "request <actor>") has a flow arrow
to the receiver's "receive <actor>" on the next rank, naming the same actor; a request's
delivery lies inside the request span after clock alignment. Exits non-zero, saying what is
wrong, otherwise.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "world"))
from check_trace import check_flows, fail, load  # noqa: E402


def main():
    path, world, repeat = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    events, unc = load(path, world)
    actors = [e for e in events if e["ph"] == "X" and e.get("cat") == "actors"]
    sends = [e for e in actors if e["name"].startswith("send ")]
    requests = [e for e in actors if e["name"].startswith("request ")]
    receives = [e for e in actors if e["name"].startswith("receive ")]
    for r in range(world):
        counts = [sum(1 for e in group if e["pid"] == r) for group in (sends, requests, receives)]
        if counts != [repeat, repeat + 1, 2 * repeat + 1]:
            fail(f"rank {r}: {counts[0]} sends, {counts[1]} requests, {counts[2]} receives; "
                 f"expected {repeat}, {repeat + 1}, {2 * repeat + 1}")
    for e in actors:
        if "error" in e["args"] or e["args"]["bytes"] <= 0:
            fail(f"a failed or empty message: {e}")

    def same(c, s):
        return c["args"]["actor"] == s["args"]["actor"] and c["args"]["bytes"] == s["args"]["bytes"]

    def is_receive(s):
        return s.get("cat") == "actors" and s["name"].startswith("receive ")

    got = check_flows(events, unc, sends, is_receive, same, nested=False)
    got += check_flows(events, unc, requests, is_receive, same, nested=True)
    if len({(e["pid"], e["ts"]) for e in got}) != len(receives):
        fail(f"{len(receives)} receive spans, {len(got)} reached by arrows")
    print(f"actor trace ok: {len(sends)} sends, {len(requests)} requests, {len(receives)} receives")


if __name__ == "__main__":
    main()
