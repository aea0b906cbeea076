#!/usr/bin/python3
"""The anchor for bench/store_bench: PyTorch's c10d TCPStore under the same workload.

Each client is its own process (as ranks are). Two measurements per client count:
  ops    N clients, each running set(key, 64 B) + get(key) on its own keys for a fixed
         time; reports total operations per second. c10d's set is one-way (no reply),
         so the same figure is printed again as ops_nowait, the anchor of troupe's loop
         with set_nowait.
  wake   N clients block in get() on one key; a setter writes the key with its monotonic
         clock in the value; each waiter records now - t_set. Reports p50/p99 in us.
Prints one JSON object per measurement, as store_bench does.
Usage: /usr/bin/python3 bench/store_c10d.py --clients 1,8,32 --seconds 2 --rounds 200
"""
import argparse
import json
import multiprocessing as mp
import sys
import time
from datetime import timedelta

import torch.distributed as dist


def client(port):
    return dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=60), False)


def ops_worker(port, idx, seconds, start, out):
    s = client(port)
    value = b"x" * 64
    key = f"ops/{idx}"
    start.wait()
    n = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        s.set(key, value)
        s.get(key)
        n += 2
    out.put(n)


def wake_waiter(port, rounds, start, out):
    s = client(port)
    lat = []
    start.wait()
    for r in range(rounds):
        v = s.get(f"wake/{r}")
        lat.append(time.monotonic_ns() - int(v))
    out.put(lat)


def wake_setter(port, rounds, waiters, start):
    s = client(port)
    start.wait()
    for r in range(rounds):
        # Give the waiters time to block in get() for this round.
        time.sleep(0.002)
        s.set(f"wake/{r}", str(time.monotonic_ns()))


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", default="1,8,32")
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=200)
    a = ap.parse_args()
    ctx = mp.get_context("fork")
    server = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=60), False)
    port = server.port
    for n in [int(x) for x in a.clients.split(",")]:
        start = ctx.Barrier(n)
        out = ctx.Queue()
        ps = [ctx.Process(target=ops_worker, args=(port, i, a.seconds, start, out)) for i in range(n)]
        for p in ps:
            p.start()
        total = sum(out.get() for _ in ps)
        for p in ps:
            p.join()
        print(json.dumps({"impl": "c10d", "bench": "ops", "clients": n,
                          "ops_per_s": total / a.seconds}), flush=True)
        # c10d's set never waits for a reply (the server sends none), so this one loop is
        # also the like-for-like anchor of store_bench's ops_nowait (set_nowait + get).
        print(json.dumps({"impl": "c10d", "bench": "ops_nowait", "clients": n,
                          "ops_per_s": total / a.seconds}), flush=True)

        start = ctx.Barrier(n + 1)
        out = ctx.Queue()
        ps = [ctx.Process(target=wake_waiter, args=(port, a.rounds, start, out)) for _ in range(n)]
        ps.append(ctx.Process(target=wake_setter, args=(port, a.rounds, n, start)))
        for p in ps:
            p.start()
        lat = []
        for _ in range(n):
            lat += out.get()
        for p in ps:
            p.join()
        # Keys of this round are left; use a fresh prefix per client count.
        for r in range(a.rounds):
            server.delete_key(f"wake/{r}")
        print(json.dumps({"impl": "c10d", "bench": "wake", "clients": n,
                          "p50_us": pct(lat, 0.5) / 1e3, "p99_us": pct(lat, 0.99) / 1e3}),
              flush=True)


if __name__ == "__main__":
    sys.exit(main())
