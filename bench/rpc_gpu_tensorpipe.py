#!/usr/bin/env python3
"""PyTorch's TensorPipe RPC agent doing what bench/rpc_gpu_bench does: two processes on
cuda:0, device map {0: 0}, the caller sends a tensor on cuda:0 and the callee returns it.

    python3 bench/rpc_gpu_tensorpipe.py [--sizes 16777216,268435456] [--iters N] [--warmup N]

Prints one JSON object per size (impl "tensorpipe", bench "gpu_echo"), like rpc_gpu_bench.
Needs torch 2.x with CUDA (the lent GPU machine has it); exits 0 with a note otherwise.
The callee is this script started again with --rank 1.
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time


def echo(t):
    return t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default=f"{16 << 20},{256 << 20}")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--port", type=int, default=0)
    a = ap.parse_args()
    try:
        import torch
        from torch.distributed import rpc
    except Exception as e:  # noqa: BLE001
        print(f"rpc_gpu_tensorpipe: torch is not importable here ({e}); nothing measured")
        return 0
    if not torch.cuda.is_available():
        print("rpc_gpu_tensorpipe: torch sees no CUDA device here; nothing measured")
        return 0
    port = a.port
    peer = None
    if a.rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        peer = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--rank", "1",
                                 "--port", str(port)])
    opts = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{port}", rpc_timeout=120,
                                           devices=[0])
    if a.rank == 0:
        opts.set_device_map("w1", {0: 0})
    rpc.init_rpc(f"w{a.rank}", rank=a.rank, world_size=2, rpc_backend_options=opts)
    if a.rank == 0:
        print(f"# rpc_gpu_tensorpipe --iters {a.iters} (torch {torch.__version__}, two processes "
              "on cuda:0, map {0: 0})", flush=True)
        for n in [int(x) for x in a.sizes.split(",") if x]:
            t = torch.ones(n, dtype=torch.uint8, device="cuda:0")
            secs = []
            for i in range(a.warmup + a.iters):
                start = time.perf_counter()
                back = rpc.rpc_sync("w1", echo, args=(t,))
                torch.cuda.current_stream().synchronize()
                s = time.perf_counter() - start
                assert back.device.type == "cuda" and back.numel() == n
                if i >= a.warmup:
                    secs.append(s)
            p50 = statistics.median(secs)
            print(json.dumps({"impl": "tensorpipe", "bench": "gpu_echo", "size": n,
                              "p50_ms": round(p50 * 1e3, 3), "gbps": round(2 * n / p50 / 1e9, 2),
                              "iters": a.iters}), flush=True)
    rpc.shutdown()
    if peer is not None:
        return peer.wait(timeout=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
