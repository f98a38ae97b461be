#!/usr/bin/env python3
"""dopt vs torch 1.13 (gloo, CPU): PostLocalSGDOptimizer steps and the DDP gradient reducer.

  python3 bench/compare_post_local_sgd_torch.py [--runs 3] [--build build-plsgd] [--summary-only]

Per run, interleaved, for world sizes 2 and 4 and 10M float32 parameters in 100
tensors (sizes proportional to 1..10, like the torch baseline):

  torch   /work/shared/baselines/postlocal/bench_postlocal.py --optim sgd|adam
          (PostLocalSGDOptimizer + PeriodicModelAverager(4, 10), 34 steps)
  dopt    dopt-run --nproc-per-node WS --master-port 0 --no-prefix
          build/bench/dopt_bench_post_local_sgd --optimizer sgd|adam (same schedule, optimizers, sizes)
  torch   this script's own DDP worker (--torch-ddp-worker): DistributedDataParallel over a
          module whose forward is sum(p.sum()), per iteration forward + backward (backward
          returns once the gradients are averaged); variants: default buckets (25 MiB,
          communication overlapped with the backward), one big bucket (bucket_cap_mb 1000,
          almost no overlap) and no DDP at all (the compute alone)
  dopt    dopt-run ... build/bench/dopt_bench_reducer (mark_ready of every parameter in
          reverse order + finalize, with overlap and without)

Every launch goes through /work/shared/baselines/launch.py, which records the
foreign CPU load during the launch (other engineers build and benchmark on
this 2-core machine). JSON lines (with "impl", "run" and "load") are appended
to bench/results/post_local_sgd_compare.jsonl; the summary (markdown, medians
over runs) is printed and written to bench/results/post_local_sgd_compare.md.

Environment: PY (torch's python, default /usr/bin/python3), MAX_WAIT (seconds
launch.py waits for a quiet machine, default 20), TRIES (launches per
measurement when the load was high, default 1).
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BASE = "/work/shared/baselines"
OUT = os.path.join(HERE, "results", "post_local_sgd_compare.jsonl")
SUMMARY = os.path.join(HERE, "results", "post_local_sgd_compare.md")
NUMEL, TENSORS = 10_000_000, 100
WORLD_SIZES = (2, 4)


# ---------------------------------------------------------------------------------------------
# torch DDP worker (run by torch's python, spawned ranks)

def tensor_sizes(numel, ntensors):
    w = [1 + (i % 10) for i in range(ntensors)]
    sizes = [numel * x // sum(w) for x in w]
    sizes[-1] += numel - sum(sizes)
    return sizes


def _ddp_rank(rank, ws, port, a):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ws,
                            timeout=datetime.timedelta(seconds=300))

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            gen = torch.Generator().manual_seed(0)
            self.ps = torch.nn.ParameterList(
                [torch.nn.Parameter(torch.rand(n, generator=gen)) for n in tensor_sizes(a.numel, a.tensors)])

        def forward(self, scale):
            return sum(p.sum() for p in self.ps) * scale

    results = []
    for variant in ("ddp", "ddp_one_bucket", "local"):
        model = Model()
        if variant == "ddp":
            run = DDP(model)
        elif variant == "ddp_one_bucket":
            run = DDP(model, bucket_cap_mb=1000)
        else:
            run = model
        times = []
        for s in range(-2, a.steps):
            for p in model.parameters():
                p.grad = None
            dist.barrier()
            t0 = time.perf_counter()
            loss = run(float(rank + 1))
            loss.backward()
            t1 = time.perf_counter()
            if s >= 0:
                times.append(t1 - t0)
        tt = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(tt, op=dist.ReduceOp.MAX)
        ms = [1e3 * t for t in tt.tolist()]
        results.append(dict(bench="ddp_torch", variant=variant, ms=round(statistics.median(ms), 3),
                            min_ms=round(min(ms), 3), world_size=ws, numel=a.numel, tensors=a.tensors,
                            steps=a.steps, torch=torch.__version__))
        del run, model
    if rank == 0:
        for r in results:
            print(json.dumps(r), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def torch_ddp_worker(a):
    import socket

    import torch.multiprocessing as mp
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    mp.spawn(_ddp_rank, args=(a.world_size, port, a), nprocs=a.world_size)


# ---------------------------------------------------------------------------------------------
# driver

def launch(cmd, tags, env=None):
    py = os.environ.get("PY", "/usr/bin/python3")
    full = [py, os.path.join(BASE, "launch.py"), "--out", OUT, "--max-wait", os.environ.get("MAX_WAIT", "20"),
            "--tries", os.environ.get("TRIES", "1")]
    for k, v in tags.items():
        full += ["--tag", f"{k}={v}"]
    full += ["--"] + cmd
    t0 = time.monotonic()
    p = subprocess.run(full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    tail = [ln for ln in p.stderr.splitlines() if ln.startswith("launch:")]
    print(f"  [{time.monotonic() - t0:5.1f}s rc={p.returncode}] {' '.join(tail) or p.stderr[-300:]}", flush=True)
    if p.returncode != 0:
        print(p.stderr[-2000:], file=sys.stderr)
    return p.returncode


def run_all(a):
    py = os.environ.get("PY", "/usr/bin/python3")
    build = os.path.join(ROOT, a.build) if not os.path.isabs(a.build) else a.build
    dopt_run = os.path.join(build, "tools", "dopt-run")
    plsgd = os.path.join(build, "bench", "dopt_bench_post_local_sgd")
    reducer = os.path.join(build, "bench", "dopt_bench_reducer")
    for b in (dopt_run, plsgd, reducer):
        if not os.access(b, os.X_OK):
            sys.exit(f"missing {b}: build dopt-run, dopt_bench_post_local_sgd and dopt_bench_reducer first")
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    up = subprocess.run(["uptime"], stdout=subprocess.PIPE, text=True).stdout.strip()
    with open(OUT, "a") as f:
        f.write(json.dumps(dict(bench="meta", started=datetime.datetime.utcnow().isoformat() + "Z", uptime=up,
                                nproc=os.cpu_count(), runs=a.runs, session=a.session)) + "\n")
    print(f"uptime: {up}", flush=True)
    env = dict(os.environ)
    for r in range(1, a.runs + 1):
        for ws in WORLD_SIZES:
            launcher = [dopt_run, "--nproc-per-node", str(ws), "--master-port", "0", "--no-prefix"]
            tags = dict(run=r, session=a.session)
            for o in ("sgd", "adam"):
                print(f"run {r} ws {ws} post-local SGD {o}: torch, dopt", flush=True)
                launch([py, os.path.join(BASE, "postlocal", "bench_postlocal.py"), "--world-size", str(ws),
                        "--optim", o, "--run", str(r)], dict(tags, impl="torch"))
                launch(launcher + [plsgd, "--params", str(NUMEL), "--tensors", str(TENSORS), "--optimizer", o,
                                   "--period", "4", "--warmup", "10", "--steps", "34", "--sizes", "torch"],
                       dict(tags, impl="dopt"), env)
            print(f"run {r} ws {ws} reducer: torch DDP, dopt (overlap, no overlap)", flush=True)
            launch([py, os.path.abspath(__file__), "--torch-ddp-worker", "--world-size", str(ws)],
                   dict(tags, impl="torch"))
            launch(launcher + [reducer, "--params", str(NUMEL), "--tensors", str(TENSORS), "--steps", "20",
                               "--sizes", "torch"], dict(tags, impl="dopt"), env)
    up = subprocess.run(["uptime"], stdout=subprocess.PIPE, text=True).stdout.strip()
    with open(OUT, "a") as f:
        f.write(json.dumps(dict(bench="meta", finished=datetime.datetime.utcnow().isoformat() + "Z", uptime=up,
                                session=a.session)) + "\n")
    print(f"uptime: {up}", flush=True)


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x):
    if x is None:
        return "–"
    return f"{x:.3g}" if x < 100 else f"{x:.0f}"


def ratio(d, t):
    return "–" if d is None or t is None or d == 0 else f"{t / d:.2f}x"


def summarize(session=None):
    recs = []
    with open(OUT) as f:
        for line in f:
            line = line.strip()
            if line:
                recs.append(json.loads(line))
    if session is None:
        sessions = [r.get("session") for r in recs if r.get("bench") != "meta" and r.get("session")]
        session = sessions[-1] if sessions else None
    recs = [r for r in recs if r.get("session") == session]
    meta = [r for r in recs if r.get("bench") == "meta"]
    data = [r for r in recs if r.get("bench") != "meta"]
    out = []
    out.append(f"dopt vs torch {next((r['torch'] for r in data if 'torch' in r), '1.13')} (gloo), "
               f"{NUMEL // 1_000_000}M float32 parameters in {TENSORS} tensors, session {session}; "
               f"cells: median over runs of the in-run medians (ms, per step the slowest rank); "
               f"'torch/dopt' > 1 means dopt is faster.")
    for m in meta:
        if "uptime" in m:
            out.append(f"- {'start' if 'started' in m else 'end'}: `{m['uptime']}`")
    loads = [r["load"]["foreign_frac"] for r in data if "load" in r]
    if loads:
        out.append(f"- foreign CPU load during the launches (launch.py, fraction of {os.cpu_count()} CPUs): "
                   f"median {statistics.median(loads):.2f}, max {max(loads):.2f}")
    out.append("")
    out.append("### PostLocalSGDOptimizer (PeriodicModelAverager(period 4, warmup 10))")
    out.append("")
    out.append("| ws | optim | torch local_ms | dopt local_ms | torch/dopt | torch avg_ms | dopt avg_ms | torch/dopt "
               "| torch avg−local | dopt avg−local | runs (t/d) | load (t/d) |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for ws in WORLD_SIZES:
        for o in ("sgd", "adam"):
            t = [r for r in data if r.get("bench") == "postlocal" and r["world_size"] == ws and r["optim"] == o]
            d = [r for r in data if r.get("benchmark") == "post_local_sgd_step" and r["world_size"] == ws
                 and r["optimizer"].lower() == o]
            tl, dl = med([r["local_ms"] for r in t]), med([r["local_ms"] for r in d])
            ta, da = med([r["avg_ms"] for r in t]), med([r["avg_ms"] for r in d])
            tdiff = med([r["avg_ms"] - r["local_ms"] for r in t])
            ddiff = med([r["avg_ms"] - r["local_ms"] for r in d if r["avg_ms"] is not None])
            tload = med([r["load"]["foreign_frac"] for r in t])
            dload = med([r["load"]["foreign_frac"] for r in d])
            out.append(f"| {ws} | {o} | {fmt(tl)} | {fmt(dl)} | {ratio(dl, tl)} | {fmt(ta)} | {fmt(da)} | "
                       f"{ratio(da, ta)} | {fmt(tdiff)} | {fmt(ddiff)} | {len(t)}/{len(d)} | "
                       f"{fmt(tload)}/{fmt(dload)} |")
    out.append("")
    out.append("### Gradient reducer (DDP), ms per iteration")
    out.append("")
    out.append("torch: forward + backward of sum(p.sum()) under DistributedDataParallel (default 25 MiB buckets, "
               "overlapped; 'one bucket': bucket_cap_mb=1000) and without DDP (compute only); "
               "dopt: mark_ready of every parameter + finalize (the gradients are given, no compute).")
    out.append("")
    out.append("| ws | torch DDP | torch DDP one bucket | torch compute only | torch DDP − compute "
               "| dopt overlap | dopt no overlap | torch DDP / dopt overlap | runs (t/d) | load (t/d) |")
    out.append("|---|---|---|---|---|---|---|---|---|---|")
    for ws in WORLD_SIZES:
        t = [r for r in data if r.get("bench") == "ddp_torch" and r["world_size"] == ws]
        d = [r for r in data if r.get("benchmark") == "reducer_iteration" and r["world_size"] == ws]
        tv = {v: med([r["ms"] for r in t if r["variant"] == v]) for v in ("ddp", "ddp_one_bucket", "local")}
        diff = med([a["ms"] - b["ms"] for a in t if a["variant"] == "ddp" for b in t
                    if b["variant"] == "local" and b["run"] == a["run"]])
        dov = med([r["ms"] for r in d if r["overlap"]])
        dno = med([r["ms"] for r in d if not r["overlap"]])
        tload = med([r["load"]["foreign_frac"] for r in t])
        dload = med([r["load"]["foreign_frac"] for r in d])
        out.append(f"| {ws} | {fmt(tv['ddp'])} | {fmt(tv['ddp_one_bucket'])} | {fmt(tv['local'])} | {fmt(diff)} | "
                   f"{fmt(dov)} | {fmt(dno)} | {ratio(dov, tv['ddp'])} | {len(t) // 3}/{len(d) // 2} | "
                   f"{fmt(tload)}/{fmt(dload)} |")
    text = "\n".join(out) + "\n"
    print(text)
    with open(SUMMARY, "w") as f:
        f.write(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=int(os.environ.get("RUNS", "3")))
    ap.add_argument("--build", default="build-plsgd", help="dopt build folder (relative to the repository)")
    ap.add_argument("--summary-only", action="store_true")
    ap.add_argument("--session", default=None, help="tag of this comparison (default: the start time)")
    ap.add_argument("--torch-ddp-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--numel", type=int, default=NUMEL)
    ap.add_argument("--tensors", type=int, default=TENSORS)
    ap.add_argument("--steps", type=int, default=20)
    a = ap.parse_args()
    if a.torch_ddp_worker:
        torch_ddp_worker(a)
        return
    if not a.summary_only:
        a.session = a.session or time.strftime("%Y%m%dT%H%M%S")
        run_all(a)
    summarize(a.session)


if __name__ == "__main__":
    main()
