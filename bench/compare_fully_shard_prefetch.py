#!/usr/bin/env python3
"""dopt.fully_shard's backward_prefetch choices against each other (and a
reference revision's fully_shard.py), interleaved, in one run:

  python3 bench/compare_fully_shard_prefetch.py [--build build] [--ref main] [--world 2] [--units 8]
      [--width 1024] [--batch 64] [--rounds 6] [--iters 4] [--out FILE]

Under mp.spawn with gloo (one intra-op thread per rank), every rank builds
the same model per variant, a Sequential of --units (Linear(width, width),
Tanh), sharded with dopt.fully_shard and Adam:
  "before_backward" and "after_gradients": this tree's python/dopt with
      backward_prefetch set so;
  "ref:<rev>" (with --ref): git show <rev>:python/dopt/fully_shard.py, loaded
      into the same dopt package (the same _C and _storage), default options.
Each round runs every variant for --iters iterations (forward, backward,
step), in an order rotated per round, after a barrier; a variant's time per
iteration is the slowest rank's. Printed (and appended to --out as one JSON
record): the medians over rounds, and the medians over rounds of the ratios
of two variants timed in the same round, with os.getloadavg() before and
after. The machine may be shared: the load is recorded, nothing waits.
"""
import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn


def load_ref(path):
    """The reference fully_shard.py as a module of the dopt package (its relative imports resolve there)."""
    import dopt
    spec = importlib.util.spec_from_file_location("dopt._fully_shard_ref", path,
                                                  submodule_search_locations=None)
    mod = importlib.util.module_from_spec(spec)
    mod.__package__ = "dopt"
    sys.modules["dopt._fully_shard_ref"] = mod
    spec.loader.exec_module(mod)
    return mod.fully_shard


def worker(rank, args, init_file, ref_path, results):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        os.environ.pop(var, None)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=args.world,
                            timeout=timedelta(minutes=10))
    import dopt
    variants = {}
    if ref_path:
        ref = load_ref(ref_path)
        variants[f"ref:{args.ref}"] = lambda m: ref(m, torch.optim.Adam, lr=1e-3)
    for p in ("before_backward", "after_gradients"):
        variants[p] = lambda m, p=p: dopt.fully_shard(m, torch.optim.Adam, backward_prefetch=p, lr=1e-3)
    runs = {}
    for name, make in variants.items():
        torch.manual_seed(0)
        model = nn.Sequential(*[m for _ in range(args.units) for m in (nn.Linear(args.width, args.width), nn.Tanh())])
        runs[name] = (model, make(model))
    x = torch.randn(args.batch, args.width, generator=torch.Generator().manual_seed(rank))

    def iterate(name, n):
        model, opt = runs[name]
        for _ in range(n):
            model(x).square().mean().backward()
            opt.step()

    for name in runs:  # warm-up: the prefetch order, the buffers
        iterate(name, 2)
    names = list(runs)
    times = {n: [] for n in names}
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            dist.barrier()
            t0 = time.perf_counter()
            iterate(name, args.iters)
            t = torch.tensor([(time.perf_counter() - t0) / args.iters], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            times[name].append(t.item())
    if rank == 0:
        results.put(times)
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--ref", default=None, help="a git revision whose python/dopt/fully_shard.py is compared too")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--units", type=int, default=8)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--iters", type=int, default=4)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, os.path.join(os.path.abspath(args.build), "python"))
    with tempfile.TemporaryDirectory() as d:
        ref_path = None
        if args.ref:
            ref_path = os.path.join(d, "fully_shard_ref.py")
            with open(ref_path, "wb") as f:
                f.write(subprocess.check_output(["git", "-C", root, "show", f"{args.ref}:python/dopt/fully_shard.py"]))
        os.environ["PYTHONPATH"] = os.pathsep.join([sys.path[0], os.environ.get("PYTHONPATH", "")])
        ctx = mp.get_context("spawn")
        results = ctx.SimpleQueue()
        load_before = os.getloadavg()
        mp.start_processes(worker, args=(args, os.path.join(d, "init"), ref_path, results), nprocs=args.world,
                           join=True, start_method="spawn")
        load_after = os.getloadavg()
        times = results.get()
    names = list(times)
    record = {
        "bench": "fully_shard_backward_prefetch", "world": args.world, "units": args.units, "width": args.width,
        "batch": args.batch, "rounds": args.rounds, "iters": args.iters, "load_before": load_before,
        "load_after": load_after, "cpus": os.cpu_count(),
        "ms_per_iter_median": {n: 1e3 * statistics.median(v) for n, v in times.items()},
        "ms_per_iter": {n: [round(1e3 * t, 2) for t in v] for n, v in times.items()},
        "ratio_median": {f"{a}/{b}": statistics.median(x / y for x, y in zip(times[a], times[b]))
                         for i, a in enumerate(names) for b in names[i + 1:]},
    }
    print(json.dumps(record, indent=1))
    if args.out:
        with open(args.out, "a") as f:
            f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
