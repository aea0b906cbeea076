#!/usr/bin/python3
"""The anchor for bench/ddp_bench: PyTorch DDP on gloo, same parameter count in the same
number of equal layers, one process per rank on 127.0.0.1, one intra-op thread each.

A step is forward + backward: loss = sum over layers of (0.5 * p).sum(), so the backward
writes every gradient, last layer first, and DDP all-reduces its buckets (default 25 MiB,
first 1 MiB) while it runs. Compute-only is the same step on the bare module.
Prints one JSON object per world size (rank 0), as ddp_bench --json does.

The ranks keep the memory they free (glibc's malloc told so through MALLOC_MMAP_THRESHOLD_
and MALLOC_TRIM_THRESHOLD_, as a CPU deployment does with jemalloc or tcmalloc): with
glibc's defaults each step's 20 MB temporaries are handed back to the kernel and faulted
in again at random, and the same compute-only step took 32-42 ms or 290-650 ms from one
step to the next (world 2, 2-vCPU VM), which drowns the overhead it is subtracted from.
--malloc glibc measures with the defaults.
Usage: /usr/bin/python3 bench/ddp_torch.py --world 2,4 --params 25000000 --layers 5
"""
import argparse
import json
import multiprocessing as mp
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


class Layers(nn.Module):
    def __init__(self, params, layers):
        super().__init__()
        per = params // layers
        sizes = [per] * (layers - 1) + [params - per * (layers - 1)]
        self.ps = nn.ParameterList([nn.Parameter(torch.full((n,), 0.01)) for n in sizes])

    def forward(self, step):
        y = torch.zeros(())
        for p in self.ps:
            y = y + (0.5 * p + step).sum()
        return y


def rank_main(rank, world, a, port, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    model = Layers(a.params, a.layers)
    ddp = DDP(model)
    # The compute-only steps (the module called directly: DDP's hooks stay idle) and the
    # DDP steps alternate, so that a drift of the machine's speed during the run falls on
    # both alike (with --malloc glibc the backward took 250-540 ms per step at world 2 from
    # one run to the next on a 2-vCPU VM).
    samples = {"local": [], "ddp": []}
    dist.barrier()
    for i in range(a.warmup + a.steps):
        for name, m in (("local", model), ("ddp", ddp)):
            for p in model.parameters():
                p.grad = None
            t0 = time.perf_counter()
            m(float(i)).backward()
            ms = torch.tensor([(time.perf_counter() - t0) * 1e3], dtype=torch.float64)
            dist.all_reduce(ms, op=dist.ReduceOp.MAX)
            if i >= a.warmup:
                samples[name].append(ms.item())
    times = {name: statistics.median(v) for name, v in samples.items()}
    if rank == 0:
        c, s = times["local"], times["ddp"]
        out.put(json.dumps({"impl": "torch", "bench": "ddp_step", "world": world,
                            "params": a.params, "compute_ms": round(c, 3),
                            "ddp_ms": round(s, 3), "overhead_ms": round(s - c, 3)}))
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", default="2,4")
    ap.add_argument("--params", type=int, default=25_000_000)
    ap.add_argument("--layers", type=int, default=5)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--malloc", choices=("kept", "glibc"), default="kept",
                    help="kept: freed memory stays in the process (default); glibc: "
                         "glibc's defaults, which return large blocks to the kernel")
    a = ap.parse_args()
    if a.malloc == "kept":
        # Read by glibc when each spawned rank starts. 32 MiB is the largest mmap threshold
        # glibc takes: the 20 MB temporaries come from the heap, which is never trimmed.
        os.environ["MALLOC_MMAP_THRESHOLD_"] = str(32 << 20)
        os.environ["MALLOC_TRIM_THRESHOLD_"] = str(1 << 40)
    ctx = mp.get_context("spawn")
    for world in [int(w) for w in a.world.split(",")]:
        out = ctx.Queue()
        port = free_port()
        procs = [ctx.Process(target=rank_main, args=(r, world, a, port, out))
                 for r in range(world)]
        for p in procs:
            p.start()
        line = out.get(timeout=600)
        for p in procs:
            p.join(timeout=120)
            if p.exitcode != 0:
                raise SystemExit(f"rank process exited with {p.exitcode}")
        print(line, flush=True)


if __name__ == "__main__":
    main()
