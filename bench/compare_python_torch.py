#!/usr/bin/env python3
"""The Python package against torch 1.13 in one run, in the same processes:
dopt.ZeroRedundancyOptimizer(Adam) vs torch's ZeroRedundancyOptimizer(Adam),
the same with a Python optimizer class (a user's subclass of torch's Adam:
its own step runs the shard under both), and dopt.PostLocalSGDOptimizer vs
torch's, all on the same torch parameters (WS ranks, gloo for torch, 1
intra-op thread per rank; dopt takes its world from torch.distributed).

    python3 bench/compare_python_torch.py [--ws 2] [--numel 50000000] [--rounds 3]
        [--out bench/results/python_compare.jsonl]

(launches itself with torchrun; PYTHONPATH must reach the built package,
default build/python). Method, as bench/compare_zero_torch.py and
bench/compare_post_local_sgd_torch.py: --numel float32 parameters in 100
tensors with sizes proportional to 1..10, gradients set once (no
forward/backward), a barrier before each step, per step the slowest rank.
ZeRO: 2 warm-up steps, median of --steps steps. PostLocalSGD (SGD lr 0.01
momentum 0.9, PeriodicModelAverager(period 2, warmup 2)): median of the
averaging steps (avg_ms) and of the other steps after warm-up (local_ms);
avg - local is the averaging itself. torch and dopt alternate, first one
then the other, per round; one JSON line per (round, implementation,
configuration), then a summary (medians over rounds, dopt/torch ratios).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer as TorchZero

HERE = os.path.dirname(os.path.abspath(__file__))
PERIOD, WARMUP = 2, 2


def tensor_sizes(numel, ntensors):
    w = [1 + (i % 10) for i in range(ntensors)]
    sizes = [numel * x // sum(w) for x in w]
    sizes[-1] += numel - sum(sizes)
    return sizes


def make_params(numel, rank):
    gen, ggen = torch.Generator().manual_seed(0), torch.Generator().manual_seed(1 + rank)
    params = []
    for n in tensor_sizes(numel, 100):
        p = torch.nn.Parameter(torch.rand(n, generator=gen))
        p.grad = torch.randn(n, generator=ggen).mul_(1e-3)
        params.append(p)
    return params


def timed_steps(step, n):
    times = []
    for _ in range(n):
        dist.barrier()
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    t = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [1e3 * x for x in t.tolist()]


class UserAdam(torch.optim.Adam):
    """A user's optimizer class in Python (dopt does not compute it: the class steps the shard)."""


def zero_run(impl, numel, bucket_view, steps, rank, optimizer_class=torch.optim.Adam):
    import dopt
    params = make_params(numel, rank)
    cls = dopt.ZeroRedundancyOptimizer if impl == "dopt" else TorchZero
    opt = cls(params, optimizer_class, parameters_as_bucket_view=bucket_view, lr=1e-3)
    if impl == "dopt":
        assert opt.uses_dopt_kernels == (optimizer_class is torch.optim.Adam)
    for _ in range(2):
        opt.step()
    times = timed_steps(opt.step, steps)
    return dict(step_ms=statistics.median(times), step_ms_min=min(times))


def plsgd_run(impl, numel, steps, rank):
    import dopt
    import dopt.averagers
    from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
    from torch.distributed.optim import PostLocalSGDOptimizer
    params = make_params(numel, rank)
    local = torch.optim.SGD(params, lr=0.01, momentum=0.9)
    if impl == "dopt":
        opt = dopt.PostLocalSGDOptimizer(optim=local, averager=dopt.averagers.PeriodicModelAverager(PERIOD, WARMUP))
    else:
        opt = PostLocalSGDOptimizer(optim=local, averager=PeriodicModelAverager(period=PERIOD, warmup_steps=WARMUP))
    kinds, times = [], []
    for _ in range(steps):
        s = opt.averager.step
        kinds.append("warmup" if s < WARMUP else ("avg" if (s - WARMUP) % PERIOD == 0 else "local"))
        times += timed_steps(opt.step, 1)
    avg = [t for t, k in zip(times, kinds) if k == "avg"]
    loc = [t for t, k in zip(times, kinds) if k == "local"]
    return dict(avg_ms=statistics.median(avg), local_ms=statistics.median(loc),
                averaging_ms=statistics.median(avg) - statistics.median(loc))


def worker(args):
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    import dopt
    rank, ws = dist.get_rank(), dist.get_world_size()
    assert dopt.get_world_size() == ws, "dopt's world is torch's"
    configs = [("zero", False), ("zero", True), ("pyzero", False), ("pyzero", True), ("plsgd", None)]
    for r in range(args.rounds):
        for kind, bv in configs:
            order = ("torch", "dopt") if r % 2 == 0 else ("dopt", "torch")
            for impl in order:
                load = os.getloadavg()[0]
                if kind == "zero":
                    res = zero_run(impl, args.numel, bv, args.steps, rank)
                elif kind == "pyzero":
                    res = zero_run(impl, args.numel, bv, args.steps, rank, UserAdam)
                else:
                    res = plsgd_run(impl, args.numel, args.plsgd_steps, rank)
                config = {"zero": "ZeRO(Adam)", "pyzero": "ZeRO(user's Python class)", "plsgd": "PostLocalSGD(SGD)"}
                rec = dict(bench="python_compare", config=config[kind],
                           bucket_view=bv, impl=impl, round=r, world_size=ws, numel=args.numel, tensors=100,
                           load1_before=round(load, 2), torch=torch.__version__, **{k: round(v, 3) for k, v in res.items()})
                if rank == 0:
                    print("RESULT " + json.dumps(rec), flush=True)
                dist.barrier()
    dist.barrier()


def summarise(recs):
    rows = []
    keys = sorted({(r["config"], r["bucket_view"]) for r in recs}, key=str)
    for cfg, bv in keys:
        got = {impl: [r for r in recs if r["config"] == cfg and r["bucket_view"] == bv and r["impl"] == impl]
               for impl in ("torch", "dopt")}
        metrics = ["step_ms"] if cfg.startswith("ZeRO") else ["avg_ms", "local_ms", "averaging_ms"]
        for m in metrics:
            t = statistics.median(x[m] for x in got["torch"])
            d = statistics.median(x[m] for x in got["dopt"])
            rows.append((cfg + ("" if bv is None else f" bucket_view={bv}"), m, t, d, d / t,
                         len(got["torch"]), len(got["dopt"])))
    out = ["| configuration | metric | torch ms | dopt ms | dopt/torch | runs t/d |", "|---|---|---|---|---|---|"]
    for c, m, t, d, q, nt, nd in rows:
        out.append(f"| {c} | {m} | {t:.1f} | {d:.1f} | {q:.2f} | {nt}/{nd} |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ws", type=int, default=2)
    ap.add_argument("--numel", type=int, default=50_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--plsgd-steps", type=int, default=12)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "python_compare.jsonl"))
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.setdefault("PYTHONPATH", os.path.join(os.path.dirname(HERE), "build", "python"))
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(args.ws), "--master_port",
           str(port), "--redirects", "1", "--tee", "1", __file__, "--worker", "--numel", str(args.numel),
           "--rounds", str(args.rounds), "--steps", str(args.steps), "--plsgd-steps", str(args.plsgd_steps)]
    session = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    recs = []
    for line in proc.stdout.splitlines():
        if "RESULT " in line:
            rec = json.loads(line.split("RESULT ", 1)[1])
            rec["session"] = session
            recs.append(rec)
    if proc.returncode != 0 or not recs:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        sys.exit(proc.returncode or 1)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "a") as f:
        for r in recs:
            f.write(json.dumps(r) + "\n")
    print(f"session {session}, {args.ws} ranks, {args.numel} parameters in 100 tensors, {args.rounds} rounds, "
          f"load average {os.getloadavg()}")
    print(summarise(recs))


if __name__ == "__main__":
    main()
