#!/usr/bin/env python3
"""DistributedOptimizer.step: dopt vs torch 1.13 (TensorPipe RPC, CPU), interleaved, in one session.

  python3 bench/compare_distributed_optimizer_torch.py [--rounds 3] [--iters 30] [--only-torch]
      [--dopt-bin build-dobench/bench/dopt_bench_distributed_optimizer] [--dopt-run build/tools/dopt-run]
      [--configs 1:1000:adam 4:1000000:sgd ...] [--out bench/results/distributed_optimizer_compare.json]

What one launch measures (both sides): K+1 processes; rank 0 is the trainer,
ranks 1..K each own one float32 parameter of N elements. Per iteration the
trainer opens a distributed-autograd context, runs a cheap forward that
touches every remote parameter (loss = sum over owners of an RPC returning
param.sum(), so every owner gets a gradient of ones for its whole parameter)
and the backward; then ONLY DistributedOptimizer.step(context) is timed
(time.perf_counter on the trainer, from the call until every owner's step
has returned). Warm-up iterations first, then --iters timed ones; rank 0
prints one JSON line with median_ms, p10_ms, p90_ms (linear interpolation
between order statistics), iters, owners, numel_per_owner, optimizer.

  torch  this script with --torch-worker: torch.multiprocessing.spawn of K+1
         processes, rpc.init_rpc (TensorPipe, 127.0.0.1), each owner's
         parameter is created by rpc.remote(owner, randn(N, requires_grad)),
         torch.distributed.optim.DistributedOptimizer(torch.optim.Adam|SGD,
         rrefs, lr=...) -- with TorchScript enabled this is the functional
         path (spec 2.7: _FunctionalAdam/_FunctionalSGD compiled on each owner,
         one RPC per owner per step, no lock); the record says which path ran
         (is_functional_optim). Before the timed iterations the worker checks,
         once, that every owner's gradient for the context is all ones of
         N elements and that the first step moved every parameter.
         Intra-op threads per process: --torch-threads (default 1).
  dopt   dopt-run --nproc-per-node K+1 --master-port 0 --no-prefix DOPT_BIN
         --owners K --numel-per-owner N --optimizer adam|sgd
         [--iters I --warmup W, only if DOPT_BIN --help lists them]

Configurations (default): K in {1, 2, 4} x N in {1000, 1000000} with Adam
(lr 1e-3), and SGD (lr 1e-2, no momentum) at K = 4 for both N. Per round,
for each configuration, one dopt launch and one torch launch back to back
(the side that goes first alternates from round to round); the figure of a
configuration is the median over rounds of the per-launch medians.

The per-owner fan-out cost is the least-squares slope of the median step
time vs K at N = 1000 with Adam (ms per extra owner), for each side.

Load: every launch records the machine's foreign CPU the way
/work/shared/baselines/launch.py does: (busy jiffies of the whole machine from
/proc/stat during the launch - CPU time of the launch and its descendants,
RUSAGE_CHILDREN) / (wall time x CPUs), plus the fraction over a short sample
before the launch and the load average; before each launch it waits up to
--quiet-wait s for the machine to be quieter than 10 %. Nothing is dropped;
the load is reported. This machine may have fewer cores than processes
(K = 4 means 5 processes): the output says how many of each.

Output: the JSON results file (--out; meta, every launch record with its
load, the summary rows, the slopes and the markdown table) and the markdown
table on stdout.
"""
import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PY = os.environ.get("PY", "/usr/bin/python3")
HZ = os.sysconf("SC_CLK_TCK")
NCPU = os.cpu_count()
DEFAULT_CONFIGS = [(k, n, "adam") for k in (1, 2, 4) for n in (1000, 1_000_000)] + \
                  [(4, 1000, "sgd"), (4, 1_000_000, "sgd")]
LR = {"adam": 1e-3, "sgd": 1e-2}


def percentile(xs, q):
    """Linear interpolation between order statistics (numpy's default), q in [0, 100]."""
    s = sorted(xs)
    if not s:
        return None
    pos = (len(s) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


# ---------------------------------------------------------------------------------------------
# torch side (--torch-worker): K+1 spawned processes. The RPC targets below are module-level
# functions so that the owners can unpickle them.

def _make_param(numel, seed):
    import torch
    g = torch.Generator().manual_seed(seed)
    return torch.randn(numel, generator=g).requires_grad_(True)


def _param_sum(rref):
    return rref.local_value().sum()


def _grad_check(ctx_id, rref):
    """On the owner: (number of elements of the context's gradient for the parameter, all ones?)."""
    import torch.distributed.autograd as dist_autograd
    p = rref.local_value()
    grads = dist_autograd.get_gradients(ctx_id)
    g = grads.get(p)
    if g is None:
        return (0, False)
    return (g.numel(), bool((g == 1).all().item()))


def _param_head(rref):
    return rref.local_value().detach()[:4].clone()


def _torch_rank(rank, ws, port, a):
    import torch
    import torch.distributed.autograd as dist_autograd
    import torch.distributed.rpc as rpc
    from torch.distributed.optim import DistributedOptimizer

    torch.set_num_threads(a.torch_threads)
    opts = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{port}",
                                           num_worker_threads=a.rpc_threads, rpc_timeout=600)
    name = "trainer" if rank == 0 else f"owner{rank}"
    rpc.init_rpc(name, rank=rank, world_size=ws, rpc_backend_options=opts)
    if rank == 0:
        owners = [f"owner{k}" for k in range(1, ws)]
        rrefs = [rpc.remote(o, _make_param, args=(a.numel_per_owner, 1234 + k)) for k, o in enumerate(owners)]
        cls = {"adam": torch.optim.Adam, "sgd": torch.optim.SGD}[a.optimizer]
        opt = DistributedOptimizer(cls, rrefs, lr=a.lr)
        step_ms, fb_ms = [], []
        for it in range(a.warmup + a.iters):
            with dist_autograd.context() as ctx:
                t0 = time.perf_counter()
                futs = [rpc.rpc_async(r.owner(), _param_sum, args=(r,)) for r in rrefs]
                loss = torch.stack([f.wait() for f in futs]).sum()
                dist_autograd.backward(ctx, [loss])
                t1 = time.perf_counter()
                if it == 0:
                    for r in rrefs:
                        n, ones = rpc.rpc_sync(r.owner(), _grad_check, args=(ctx, r))
                        if n != a.numel_per_owner or not ones:
                            raise RuntimeError(f"gradient on {r.owner().name}: {n} elements, all ones: {ones}")
                    before = [rpc.rpc_sync(r.owner(), _param_head, args=(r,)) for r in rrefs]
                    t1 = time.perf_counter()
                opt.step(ctx)
                t2 = time.perf_counter()
                if it == 0:
                    after = [rpc.rpc_sync(r.owner(), _param_head, args=(r,)) for r in rrefs]
                    for r, b, c in zip(rrefs, before, after):
                        if torch.equal(b, c):
                            raise RuntimeError(f"step did not change the parameter on {r.owner().name}")
            if it >= a.warmup:
                step_ms.append((t2 - t1) * 1e3)
                fb_ms.append((t1 - t0) * 1e3)
        rec = dict(impl="torch", owners=ws - 1, numel_per_owner=a.numel_per_owner, optimizer=a.optimizer,
                   lr=a.lr, iters=a.iters, warmup=a.warmup,
                   median_ms=statistics.median(step_ms), p10_ms=percentile(step_ms, 10),
                   p90_ms=percentile(step_ms, 90), min_ms=min(step_ms), mean_ms=statistics.fmean(step_ms),
                   fwd_bwd_median_ms=statistics.median(fb_ms),
                   is_functional_optim=bool(opt.is_functional_optim), grads_checked=True,
                   torch_threads=a.torch_threads, rpc_threads=a.rpc_threads, processes=ws,
                   torch_version=torch.__version__, backend="tensorpipe")
        print(json.dumps(rec), flush=True)
    rpc.shutdown()


def torch_worker(a):
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_torch_rank, args=(a.owners + 1, port, a), nprocs=a.owners + 1, join=True)


# ---------------------------------------------------------------------------------------------
# driver

def busy_jiffies():  # as /work/shared/baselines/launch.py
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal guest guest_nice
    return sum(v[:8]) - v[3] - v[4] - v[7]


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def sample_frac(seconds):
    b0, t0 = busy_jiffies(), time.monotonic()
    time.sleep(seconds)
    return (busy_jiffies() - b0) / HZ / ((time.monotonic() - t0) * NCPU)


def rel(c):
    return os.path.relpath(c, ROOT) if c.startswith(ROOT + os.sep) else c


def launch(cmd, quiet_wait, timeout):
    """Runs cmd; returns (JSON records from its stdout, load dict)."""
    start = time.monotonic()
    pre = sample_frac(0.5)
    while pre > 0.10 and time.monotonic() - start < quiet_wait:
        pre = sample_frac(1.0)
    waited = time.monotonic() - start
    la0 = os.getloadavg()
    c0, b0, t0 = children_cpu(), busy_jiffies(), time.monotonic()
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                           timeout=timeout)
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        rc, out, err = "timeout", e.stdout or "", e.stderr or ""
        out = out.decode() if isinstance(out, bytes) else out
        err = err.decode() if isinstance(err, bytes) else err
    wall = time.monotonic() - t0
    own = children_cpu() - c0
    busy = (busy_jiffies() - b0) / HZ
    recs = []
    for line in out.splitlines():
        s = line.strip()
        if s.startswith("[rank"):  # dopt-run's prefix, in case --no-prefix is not there
            s = s.split("]", 1)[1].strip()
        if s.startswith("{"):
            try:
                recs.append(json.loads(s))
            except json.JSONDecodeError:
                pass
    if rc != 0 or not recs:
        sys.stderr.write(out[-4000:] + err[-4000:])
        sys.stderr.write(f"launch failed (rc {rc}): {' '.join(cmd)}\n")
        recs = []
    load = dict(foreign_frac=round(max(0.0, busy - own) / (wall * NCPU), 3), pre_frac=round(pre, 3),
                waited_s=round(waited, 1), wall_s=round(wall, 2), own_cpu_s=round(own, 2),
                loadavg_before=[round(x, 2) for x in la0], loadavg_after=[round(x, 2) for x in os.getloadavg()],
                ncpu=NCPU, rc=rc, cmd=" ".join(rel(c) for c in cmd))
    return recs, load


def dopt_help_flags(a):
    try:
        h = subprocess.run([a.dopt_bin, "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return set()
    return {f for f in ("--iters", "--warmup") if f in h}


def first_existing(paths):
    for p in paths:
        if os.access(p, os.X_OK):
            return p
    return paths[0]


def med(xs):
    return statistics.median(xs) if xs else None


def slope(points):
    """Least-squares slope of y over x; None with fewer than 2 distinct x."""
    if len({x for x, _ in points}) < 2:
        return None
    mx = statistics.fmean(x for x, _ in points)
    my = statistics.fmean(y for _, y in points)
    return sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)


def fmt(x, nd=3):
    if x is None:
        return "-"
    return f"{x:.{nd}f}" if abs(x) < 100 else f"{x:.1f}"


def summarize(records, configs):
    rows = []
    for k, n, o in configs:
        row = dict(owners=k, numel_per_owner=n, optimizer=o, processes=k + 1)
        for impl in ("dopt", "torch"):
            rs = [r for r in records if r["impl"] == impl and r["owners"] == k and r["numel_per_owner"] == n
                  and r["optimizer"] == o]
            row[impl] = dict(median_of_medians_ms=med([r["median_ms"] for r in rs]),
                             round_medians_ms=[round(r["median_ms"], 4) for r in rs],
                             p10_ms=med([r["p10_ms"] for r in rs]), p90_ms=med([r["p90_ms"] for r in rs]),
                             launches=len(rs), foreign_frac_median=med([r["load"]["foreign_frac"] for r in rs]))
        d, t = row["dopt"]["median_of_medians_ms"], row["torch"]["median_of_medians_ms"]
        row["ratio_dopt_over_torch"] = d / t if d is not None and t else None
        rows.append(row)
    slopes = {}
    for impl in ("dopt", "torch"):
        pts = [(r["owners"], r[impl]["median_of_medians_ms"]) for r in rows
               if r["numel_per_owner"] == 1000 and r["optimizer"] == "adam"
               and r[impl]["median_of_medians_ms"] is not None]
        slopes[impl] = dict(ms_per_owner=slope(pts), points=pts)
    return rows, slopes


def spread(s):
    return "-" if s["p10_ms"] is None else f"{fmt(s['p10_ms'])}-{fmt(s['p90_ms'])}"


def table(rows, slopes, meta):
    lines = ["| config (owners K, N per owner, optimizer, processes) | dopt median ms | torch median ms | "
             "dopt/torch | dopt p10-p90 ms | torch p10-p90 ms | launches dopt/torch | foreign CPU dopt/torch |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        d, t = r["dopt"], r["torch"]
        over = " (oversubscribed)" if r["processes"] > NCPU else ""
        lines.append(
            f"| K={r['owners']}, N={r['numel_per_owner']:,}, {r['optimizer']}, {r['processes']} procs{over} | "
            f"{fmt(d['median_of_medians_ms'])} | {fmt(t['median_of_medians_ms'])} | "
            f"{fmt(r['ratio_dopt_over_torch'], 2)} | {spread(d)} | {spread(t)} | {d['launches']}/{t['launches']} | "
            f"{fmt(d['foreign_frac_median'], 2)}/{fmt(t['foreign_frac_median'], 2)} |")
    lines.append("")
    for impl in ("dopt", "torch"):
        s = slopes[impl]
        lines.append(f"Per-owner fan-out cost ({impl}, Adam, N=1000, least-squares slope of the median over "
                     f"K={[p[0] for p in s['points']]}): {fmt(s['ms_per_owner'], 4)} ms per owner")
    lines.append("")
    lines.append(f"Machine: {NCPU} CPUs; a launch runs K+1 processes, so K>={NCPU} oversubscribes the cores "
                 f"(K=4: 5 processes on {NCPU} cores). torch: {meta['torch_threads']} intra-op thread(s) per "
                 f"process, {meta['rpc_threads']} TensorPipe worker threads, "
                 f"functional (TorchScript) path: {meta.get('torch_functional_path')}. Median over "
                 f"{meta['rounds']} round(s) of per-launch medians of {meta['iters']} timed steps "
                 f"(after {meta['warmup']} warm-up) per launch; foreign CPU = share of the machine used by "
                 f"other processes during the launch (median over launches).")
    return "\n".join(lines)


def parse_config(s):
    k, n, o = s.split(":")
    return int(k), int(n), o


def driver(a):
    configs = [parse_config(c) for c in a.configs] if a.configs else DEFAULT_CONFIGS
    use_dopt = not a.only_torch
    extra = set()
    if use_dopt:
        for f in (a.dopt_run, a.dopt_bin):
            if not os.access(f, os.X_OK):
                raise SystemExit(f"{f}: not built (or pass --only-torch)")
        extra = dopt_help_flags(a)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    meta = dict(session=started, ncpu=NCPU, rounds=a.rounds, iters=a.iters, warmup=a.warmup,
                torch_threads=a.torch_threads, rpc_threads=a.rpc_threads, lr=LR, only_torch=a.only_torch,
                dopt_bin=rel(a.dopt_bin) if use_dopt else None, dopt_run=rel(a.dopt_run) if use_dopt else None,
                dopt_flags_passed=sorted(extra), configs=[list(c) for c in configs],
                order="per round and configuration one dopt and one torch launch back to back; "
                      "dopt first in odd rounds, torch first in even rounds",
                note=f"K+1 processes per launch on {NCPU} CPUs (K=4: 5 processes)")
    records = []
    for rnd in range(1, a.rounds + 1):
        for k, n, o in configs:
            impls = (["dopt"] if use_dopt else []) + ["torch"]
            if rnd % 2 == 0:
                impls.reverse()
            for impl in impls:
                lr = LR[o]
                if impl == "torch":
                    cmd = [PY, os.path.abspath(__file__), "--torch-worker", "--owners", str(k),
                           "--numel-per-owner", str(n), "--optimizer", o, "--lr", repr(lr),
                           "--iters", str(a.iters), "--warmup", str(a.warmup),
                           "--torch-threads", str(a.torch_threads), "--rpc-threads", str(a.rpc_threads)]
                else:
                    cmd = [a.dopt_run, "--nproc-per-node", str(k + 1), "--master-port", "0", "--no-prefix",
                           a.dopt_bin, "--owners", str(k), "--numel-per-owner", str(n), "--optimizer", o]
                    if "--iters" in extra:
                        cmd += ["--iters", str(a.iters)]
                    if "--warmup" in extra:
                        cmd += ["--warmup", str(a.warmup)]
                recs, load = launch(cmd, a.quiet_wait, a.launch_timeout)
                if not recs:
                    print(f"round {rnd} K={k} N={n} {o} {impl}: FAILED ({load['rc']})", flush=True)
                    continue
                rec = recs[0]
                rec.update(impl=impl, round=rnd, session=started, load=load)
                rec.setdefault("owners", k)
                rec.setdefault("numel_per_owner", n)
                rec.setdefault("optimizer", o)
                if (rec["owners"], rec["numel_per_owner"], rec["optimizer"]) != (k, n, o):
                    raise SystemExit(f"record does not match the launch: {rec}")
                if impl == "dopt" and rec.get("simulated"):
                    raise SystemExit(f"the dopt record says it ran simulated, not under dopt-run: {rec}")
                if impl == "torch":
                    meta["torch_functional_path"] = rec.get("is_functional_optim")
                records.append(rec)
                print(f"round {rnd} K={k} N={n} {o} {impl}: median {rec['median_ms']:.4f} ms "
                      f"(p10 {rec['p10_ms']:.4f}, p90 {rec['p90_ms']:.4f}; foreign {load['foreign_frac']}, "
                      f"wall {load['wall_s']} s)", file=sys.stderr, flush=True)
    rows, slopes = summarize(records, configs)
    md = table(rows, slopes, meta)
    out = dict(meta=meta, summary=rows, fan_out_slope=slopes, table_md=md, records=records)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(md)
    print(f"\nwritten: {rel(os.path.abspath(a.out))}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dopt-bin", default=first_existing(
        [os.path.join(ROOT, "build-dobench", "bench", "dopt_bench_distributed_optimizer"),
         os.path.join(ROOT, "build", "bench", "dopt_bench_distributed_optimizer")]))
    ap.add_argument("--dopt-run", default=first_existing(
        [os.path.join(ROOT, "build-dobench", "tools", "dopt-run"), os.path.join(ROOT, "build", "tools", "dopt-run")]))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=30, help="timed steps per launch")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps first (torch; dopt if it takes --warmup)")
    ap.add_argument("--only-torch", action="store_true", help="run without the dopt binary")
    ap.add_argument("--configs", nargs="+", default=None, metavar="K:N:OPT",
                    help="e.g. 1:1000:adam 4:1000000:sgd (default: the issue's eight configurations)")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "distributed_optimizer_compare.json"))
    ap.add_argument("--quiet-wait", type=float, default=10.0,
                    help="wait up to this many s for foreign CPU < 10%% before each launch")
    ap.add_argument("--launch-timeout", type=float, default=300.0)
    ap.add_argument("--torch-threads", type=int, default=1, help="torch intra-op threads per process")
    ap.add_argument("--rpc-threads", type=int, default=16, help="TensorPipe num_worker_threads (torch default 16)")
    # internal: one torch launch
    ap.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--owners", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--numel-per-owner", type=int, default=1000, help=argparse.SUPPRESS)
    ap.add_argument("--optimizer", choices=["adam", "sgd"], default="adam", help=argparse.SUPPRESS)
    ap.add_argument("--lr", type=float, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.torch_worker:
        if a.lr is None:
            a.lr = LR[a.optimizer]
        torch_worker(a)
    else:
        driver(a)


if __name__ == "__main__":
    main()
