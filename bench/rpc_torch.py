#!/usr/bin/python3
"""The PyTorch anchor of bench/rpc_bench.cpp: the same measurements with
torch.distributed.rpc (TensorPipe, torch 1.13 from Debian). Prints one JSON object per
measurement with impl "anchor" for bench/compare.py.

  /usr/bin/python3 bench/rpc_torch.py [--iters N] [--seconds S] [--sizes a,b,c] [--tcp-only]

Under a launcher (RANK, WORLD_SIZE=2, MASTER_ADDR, MASTER_PORT in the environment: torchrun
or set by hand), the program is one side of the 2-process job instead of spawning both
(init_method env://, so the sides may run on different hosts; bench/hosts_bench.sh): rank 0
drives and prints the roundtrip, async and echo figures, rank 1 serves. The membership
figures (init, join) are single-host only.
"""
import argparse
import json
import os
import socket
import statistics
import sys
import threading
import time

import torch
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp


def noop(x):
    return x


def echo(t):
    return t


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def options(port, tcp_only):
    method = "env://" if port is None else f"tcp://127.0.0.1:{port}"
    kw = {"init_method": method, "num_worker_threads": 16, "rpc_timeout": 120}
    if tcp_only:
        kw["_transports"] = ["uv"]
        kw["_channels"] = ["basic"]
    return rpc.TensorPipeRpcBackendOptions(**kw)


def emit(bench, **kv):
    print(json.dumps(dict(impl="anchor", bench=bench, **kv)), flush=True)


def pct(v, p):
    v = sorted(v)
    return v[int(p * (len(v) - 1))]


def calls_main(rank, port, a, q):
    rpc.init_rpc(f"w{rank}", rank=rank, world_size=2, rpc_backend_options=options(port, a.tcp_only))
    if rank == 0:
        lat = []
        for i in range(a.iters + 200):
            t0 = time.perf_counter()
            rpc.rpc_sync("w1", noop, args=(i,))
            if i >= 200:
                lat.append((time.perf_counter() - t0) * 1e6)
        q.put(("roundtrip", dict(variant="rpc", p50_us=pct(lat, 0.5), p99_us=pct(lat, 0.99))))
        sem = threading.Semaphore(64)
        done = [0]
        lock = threading.Lock()

        def finished(_):
            with lock:
                done[0] += 1
            sem.release()

        t0 = time.perf_counter()
        until = t0 + a.seconds
        futs = []
        while time.perf_counter() < until:
            sem.acquire()
            f = rpc.rpc_async("w1", noop, args=(1,))
            f.add_done_callback(finished)
            futs.append(f)
        for f in futs:
            f.wait()
        q.put(("async", dict(in_flight=64, calls_per_s=float(done[0]) / (time.perf_counter() - t0))))
        for sz in a.sizes:
            t = torch.zeros(sz, dtype=torch.uint8)
            reps = 8 if sz >= (16 << 20) else 30
            gbs = []
            for i in range(reps + 2):
                t0 = time.perf_counter()
                rpc.rpc_sync("w1", echo, args=(t,))
                if i >= 2:
                    gbs.append(2.0 * sz / (time.perf_counter() - t0) / 1e9)
            q.put(("echo", dict(variant="rpc", bytes=sz, GBps=pct(gbs, 0.5))))
    rpc.shutdown()


def init_main(rank, port, world, q, tcp_only):
    t0 = time.perf_counter()
    rpc.init_rpc(f"s{rank}", rank=rank, world_size=world, rpc_backend_options=options(port, tcp_only))
    q.put((time.perf_counter() - t0) * 1e3)
    rpc.shutdown()


def dyn_main(rank, port, q, stop, tcp_only):
    rpc.init_rpc(f"d{rank}", rank=rank, rpc_backend_options=options(port, tcp_only))
    q.put(rank)
    stop.wait(300)
    rpc.shutdown()


def joiner_main(port, q, tcp_only):
    t0 = time.perf_counter()
    rpc.init_rpc("d4", rank=4, rpc_backend_options=options(port, tcp_only))
    join_ms = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    rpc.shutdown()
    q.put((join_ms, (time.perf_counter() - t0) * 1e3))


class Printer:
    """Stands in for the queue under a launcher: rank 0 prints each figure at once."""

    def put(self, item):
        bench, kv = item
        emit(bench, **kv)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=3000)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--sizes", default="4096,1048576,16777216,67108864")
    ap.add_argument("--tcp-only", action="store_true")
    a = ap.parse_args()
    a.sizes = [int(s) for s in a.sizes.split(",")]
    print(f"# rpc_torch.py torch {torch.__version__} iters={a.iters} tcp_only={a.tcp_only}", file=sys.stderr)
    if "RANK" in os.environ:
        if int(os.environ.get("WORLD_SIZE", "0")) != 2:
            sys.exit("rpc_torch.py: under a launcher, run 2 processes (WORLD_SIZE=2)")
        calls_main(int(os.environ["RANK"]), None, a, Printer())
        return 0
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    ps = [ctx.Process(target=calls_main, args=(r, port, a, q)) for r in range(2)]
    [p.start() for p in ps]
    [p.join() for p in ps]
    while not q.empty():
        bench, kv = q.get()
        emit(bench, **kv)
    port = free_port()
    ps = [ctx.Process(target=init_main, args=(r, port, 4, q, a.tcp_only)) for r in range(4)]
    [p.start() for p in ps]
    [p.join() for p in ps]
    emit("init", workers=4, init_ms=max(q.get() for _ in range(4)))
    port = free_port()
    stop = ctx.Event()
    ps = []
    for r in range(4):  # one at a time, as the group grows
        p = ctx.Process(target=dyn_main, args=(r, port, q, stop, a.tcp_only))
        p.start()
        ps.append(p)
        q.get()
    j = ctx.Process(target=joiner_main, args=(port, q, a.tcp_only))
    j.start()
    j.join()
    join_ms, leave_ms = q.get()
    emit("join", workers=5, join_ms=join_ms, leave_ms=leave_ms)
    stop.set()
    [p.join() for p in ps]


if __name__ == "__main__":
    sys.exit(main())
