#!/usr/bin/env python3
"""torch 1.13's side of bench/compare_checkpoint_torch.py: a consolidated
ZeroRedundancyOptimizer(Adam) checkpoint, saved and loaded.

  python3 bench/checkpoint_torch.py --mode save|load --dir D [--world-size 2] [--numel 50000000]

Spawns --world-size ranks (gloo over loopback, 1 intra-op thread each); every
rank builds --numel float32 parameters in 100 tensors (sizes proportional to
1..10, as the baselines' bench_zero.py) and ZeroRedundancyOptimizer(Adam,
lr 1e-3).
  save: one step, consolidate_state_dict(to=0), torch.save(state_dict()) on
        rank 0 to D/torch-consolidated.pt.
  load: a fresh optimizer; from a barrier, torch.load(D/torch-consolidated.pt)
        and load_state_dict on every rank, timed to the slowest rank's end.
        Memory: the rise of the peak RSS (VmHWM, reset through
        /proc/self/clear_refs just before) over the RSS before, the largest
        over the ranks. CPU: the process's user + system time over the
        load, the largest over the ranks.
Prints one JSON line (rank 0).
"""
import argparse
import datetime
import json
import os
import resource
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.optim import ZeroRedundancyOptimizer


def tensor_sizes(numel, ntensors=100):
    w = [1 + (i % 10) for i in range(ntensors)]
    sizes = [numel * x // sum(w) for x in w]
    sizes[-1] += numel - sum(sizes)
    return sizes


def status_bytes(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return -1


def cpu_ms():
    """The process's CPU time so far (user + system), ms."""
    u = resource.getrusage(resource.RUSAGE_SELF)
    return 1e3 * (u.ru_utime + u.ru_stime)


def reset_peak():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def state_bytes(optim):
    return sum(v.numel() * v.element_size() for st in optim.state.values() for v in st.values() if torch.is_tensor(v))


def worker(rank, ws, port, a):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ws,
                            timeout=datetime.timedelta(seconds=600))
    params = []
    for k, n in enumerate(tensor_sizes(a.numel)):
        p = torch.nn.Parameter(torch.full((n,), 0.5))
        p.grad = torch.full((n,), 1e-3 * ((k + rank) % 7 + 1))
        params.append(p)
    opt = ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.Adam, lr=1e-3)
    path = os.path.join(a.dir, "torch-consolidated.pt")
    rec = dict(benchmark="checkpoint_load", impl="torch", mode=a.mode, params=a.numel, world_size=ws,
               torch=torch.__version__)
    if a.mode == "save":
        opt.step()
        opt.consolidate_state_dict(to=0)
        if rank == 0:
            os.makedirs(a.dir, exist_ok=True)
            torch.save(opt.state_dict(), path)
        dist.barrier()
        rec["consolidated_bytes"] = os.path.getsize(path) if rank == 0 else 0
    else:
        dist.barrier()
        reset_peak()
        rss0 = status_bytes("VmRSS")
        cpu0 = cpu_ms()
        t0 = time.perf_counter()
        opt.load_state_dict(torch.load(path))
        ms = 1e3 * (time.perf_counter() - t0)
        cpu = cpu_ms() - cpu0
        rise = status_bytes("VmHWM") - rss0
        m = torch.tensor([ms, rise, state_bytes(opt.optim), cpu], dtype=torch.float64)
        dist.all_reduce(m, op=dist.ReduceOp.MAX)
        ms, rise, state, cpu = m.tolist()
        rec.update(load_ms=round(ms, 1), peak_rise_bytes=int(rise), state_bytes_per_rank=int(state),
                   peak_rise_over_state=round(rise / state, 3), load_cpu_ms=round(cpu, 1))
    if rank == 0:
        print(json.dumps(rec), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=["save", "load"], required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--numel", type=int, default=50_000_000)
    a = ap.parse_args()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    mp.spawn(worker, args=(a.world_size, free_port(), a), nprocs=a.world_size)


if __name__ == "__main__":
    main()
