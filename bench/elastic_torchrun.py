"""The torchrun anchor of bench/elastic_bench.sh: the same training as train_demo's elastic
mode (a 16-64-4 MLP, SGD lr 0.2, 320 global steps of 128 samples split over the world), on
DDP over gloo under `torchrun --max-restarts 1`. Rank 0 checkpoints the model and the step
after every step (torch.save to a temporary file, then rename), so a restart loses only
the step in flight. On the first start, rank VICTIM kills itself with SIGKILL at step
KILL_STEP; torchrun then stops every worker and starts them all again; they re-initialise
the process group, load the checkpoint and go on.

Prints the same "recovery: ..." lines as train_demo --recovery-report (wall-clock ns):
  recovery: worker<R> killed at T (step S)
  recovery: worker<R> started at T                      (after a restart)
  recovery: worker<R> completed step S at T (...)       (the first step after a (re)start)

  torchrun --standalone --nproc_per_node 4 --max_restarts 1 --monitor_interval 0.1 \
    bench/elastic_torchrun.py --ckpt DIR --victim 1 --kill-step 100
"""
import time

STARTED_NS = time.time_ns()  # before the imports: a restarted worker pays for them again

import argparse
import os
import signal
import sys

import torch
import torch.distributed as dist
import torch.nn as nn


def now_ns():
    return time.time_ns()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ckpt", required=True, help="folder for the checkpoint")
    p.add_argument("--victim", type=int, default=1)
    p.add_argument("--kill-step", type=int, default=100)
    p.add_argument("--steps", type=int, default=320)
    p.add_argument("--global-batch", type=int, default=128)
    p.add_argument("--samples", type=int, default=8192)
    a = p.parse_args()

    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    rank = int(os.environ["RANK"])
    me = f"worker{rank}"
    if restart > 0:
        print(f"recovery: {me} started at {STARTED_NS}", flush=True)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    world = dist.get_world_size()

    g = torch.Generator().manual_seed(7)
    x = torch.randn(a.samples, 16, generator=g)
    y = torch.randint(0, 4, (a.samples,), generator=g)
    torch.manual_seed(11)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    start = 0
    path = os.path.join(a.ckpt, "checkpoint.pt")
    if os.path.exists(path):
        state = torch.load(path)
        model.load_state_dict(state["model"])
        start = state["step"] + 1
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.2)
    loss_fn = nn.CrossEntropyLoss()
    steps_per_epoch = a.samples // a.global_batch
    part = a.global_batch // world
    first = True
    for step in range(start, a.steps):
        if restart == 0 and rank == a.victim and step == a.kill_step:
            print(f"recovery: {me} killed at {now_ns()} (step {step})", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        base = (step % steps_per_epoch) * a.global_batch + rank * part
        opt.zero_grad()
        loss_fn(ddp(x[base:base + part]), y[base:base + part]).backward()
        opt.step()
        if rank == 0:
            tmp = path + ".tmp"
            torch.save({"model": model.state_dict(), "step": step}, tmp)
            os.replace(tmp, path)
        if first:
            print(f"recovery: {me} completed step {step} at {now_ns()} (restart {restart}, "
                  f"world {world})", flush=True)
            first = False
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
