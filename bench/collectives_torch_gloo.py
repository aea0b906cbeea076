#!/usr/bin/python3
"""The anchor for bench/collectives_bench: PyTorch's gloo process group on the same sizes,
iteration counts and element type (float32 unless --dtype names bfloat16, float16, ...), one
process per rank on 127.0.0.1.

Prints one JSON object per measurement (rank 0), as collectives_bench --json does, with
cpu_us: rank 0's process CPU time (all threads, user + system) per operation.
Usage: /usr/bin/python3 bench/collectives_torch_gloo.py --world 2 --min 4096 --max 67108864

Under a launcher (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in the environment: torchrun or
set by hand), the program is that one rank instead (init_method env://, --world ignored),
so that ranks may run on several hosts (bench/hosts_bench.sh).
"""
import argparse
import json
import multiprocessing as mp
import os
import resource
import socket
import sys
import time

import torch
import torch.distributed as dist


def bus_factor(op, n):
    if op == "allreduce":
        return 2.0 * (n - 1) / n
    if op == "allgather":
        return (n - 1) / n
    return 1.0


def iters_for(nbytes, fixed):
    if fixed > 0:
        return fixed
    # As collectives_bench: 500 up to 64 KiB, where 50 operations last less than a tick.
    if nbytes <= (64 << 10):
        return 500
    return 50 if nbytes <= (1 << 20) else 10 if nbytes <= (16 << 20) else 4


def rank_main(rank, a, port):
    torch.set_num_threads(1)
    if port is None:  # under a launcher
        dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=a.world)
    else:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=a.world)
    n = a.world
    for op in a.ops.split(","):
        nbytes = a.min
        while nbytes <= a.max:
            dt = getattr(torch, a.dtype)
            count = nbytes // torch.tensor([], dtype=dt).element_size()
            x = torch.ones(count, dtype=dt)
            per_rank = count // n
            if op == "allgather":
                src = x[:per_rank]
                outs = [torch.empty(per_rank, dtype=dt) for _ in range(n)]

            def run():
                if op == "allreduce":
                    dist.all_reduce(x)
                elif op == "broadcast":
                    dist.broadcast(x, 0)
                else:
                    dist.all_gather(outs, src)

            for _ in range(3):
                run()
            dist.barrier()
            iters = iters_for(nbytes, a.iters)
            ru = resource.getrusage(resource.RUSAGE_SELF)
            cpu0 = ru.ru_utime + ru.ru_stime
            t = time.perf_counter()
            for _ in range(iters):
                run()
            us = (time.perf_counter() - t) / iters * 1e6
            ru = resource.getrusage(resource.RUSAGE_SELF)
            cpu_us = (ru.ru_utime + ru.ru_stime - cpu0) / iters * 1e6
            if rank == 0:
                algbw = nbytes / us / 1e3
                row = {"impl": "torch-gloo", "bench": op, "world": n, "bytes": nbytes}
                if a.dtype != "float32":
                    row["dtype"] = a.dtype
                row.update({"time_us": us, "busbw_GBps": algbw * bus_factor(op, n),
                            "cpu_us": cpu_us})
                print(json.dumps(row), flush=True)
            nbytes *= 4
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--ops", default="allreduce,broadcast,allgather")
    ap.add_argument("--min", type=int, default=4 << 10)
    ap.add_argument("--max", type=int, default=64 << 20)
    ap.add_argument("--iters", type=int, default=0)
    ap.add_argument("--dtype", default="float32",
                    choices=["float32", "float64", "float16", "bfloat16", "int32", "int64"])
    a = ap.parse_args()
    if "RANK" in os.environ:
        a.world = int(os.environ["WORLD_SIZE"])
        rank_main(int(os.environ["RANK"]), a, None)
        return 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("fork")
    ps = [ctx.Process(target=rank_main, args=(r, a, port)) for r in range(a.world)]
    for p in ps:
        p.start()
    rc = 0
    for p in ps:
        p.join()
        rc |= p.exitcode != 0
    return rc


if __name__ == "__main__":
    sys.exit(main())
