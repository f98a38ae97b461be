#!/usr/bin/env python3
"""One rank of torch 1.13's gloo across hosts (bench/compare_multihost.sh).

Reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, GLOO_SOCKET_IFNAME from the
environment; times all_reduce and all_gather of float32 tensors at SIZES
(the whole buffer, as nccl-tests: all_gather's output), ITERS back-to-back
calls after a tenth of them as warm-up; rank 0 prints one JSON line per op and
size: us = max over ranks of the elapsed time / ITERS, algbw = bytes / us.
"""
import json
import os
import sys
import time

import torch
import torch.distributed as dist

SIZES = [int(s) for s in (sys.argv[1] if len(sys.argv) > 1 else "4096,1048576,16777216,67108864,268435456").split(",")]
ITERS = {4 << 10: 200, 1 << 20: 40, 16 << 20: 8, 64 << 20: 4, 256 << 20: 2}

torch.set_num_threads(1)
dist.init_process_group("gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
                        rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
ws, rank = dist.get_world_size(), dist.get_rank()
for op in ("all_reduce", "all_gather"):
    for size in SIZES:
        n = size // 4
        if op == "all_reduce":
            x = torch.rand(n)
            fn = lambda: dist.all_reduce(x)
        else:
            x = torch.rand(n // ws)
            outs = [torch.empty(n // ws) for _ in range(ws)]
            fn = lambda: dist.all_gather(outs, x)
        iters = ITERS.get(size, 4)
        for _ in range(max(1, iters // 10)):
            fn()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        el = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(el, op=dist.ReduceOp.MAX)
        us = el.item() / iters * 1e6
        if rank == 0:
            print(json.dumps({"impl": "gloo", "op": op, "world_size": ws, "bytes": size, "iters": iters,
                              "us": round(us, 2), "algbw_gbs": round(size / us / 1e3, 4)}), flush=True)
dist.destroy_process_group()
