#!/usr/bin/env python3
"""dopt vs torch 1.13 (gloo, CPU): one DiLoCo outer synchronisation, wire bytes, overlap.

  python3 bench/compare_diloco_torch.py [--runs 2] [--build build] [--params 10000000]

Per run, interleaved, for world sizes 2 and 4, 10M float32 parameters in 100
tensors (sizes proportional to 1..10, like the other torch baselines):

  torch  this script's worker (--torch-worker, spawned gloo ranks): torchft's
         DiLoCo synchronisation written with torch.distributed: per parameter
         delta = anchor - param, the deltas flattened into one buffer,
         dist.all_reduce(SUM) (async work, waited), divided by the world size,
         local copies saved, parameters reset to the anchors, the averaged
         delta as their gradients, outer SGD(lr 0.7, momentum 0.9, nesterov)
         step, anchors copied from the parameters, parameters lerp'ed towards
         the local copies with alpha 0, zero_grad(set_to_none=True).
  dopt   dopt-run --nproc-per-node WS build/bench/dopt_bench_diloco --mode sync
         (DiLoCoAverager, sync_every 1: the same steps), float32 and int8 wire.
Then, at 2 ranks, dopt's overlap runs (--mode overlap, H 4, delay 0 and 2), with inner steps
that load the CPU and with a 60 ms sleep added to each (a stand-in for accelerator compute).

Each timed sync starts after a barrier; the slowest rank's time counts;
medians over the iterations. JSON lines go to bench/results/diloco_compare.jsonl,
the summary (markdown) to bench/results/diloco_compare.md and stdout. The
1-minute load average before and after each launch is recorded: this machine
is shared, read the ratios, not the milliseconds.

Environment: PY (torch's python, default /usr/bin/python3).
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
OUT = os.path.join(HERE, "results", "diloco_compare.jsonl")
SUMMARY = os.path.join(HERE, "results", "diloco_compare.md")
TENSORS = 100
WORLD_SIZES = (2, 4)


def tensor_sizes(numel, ntensors):
    w = [1 + (i % 10) for i in range(ntensors)]
    sizes = [numel * x // sum(w) for x in w]
    sizes[-1] += numel - sum(sizes)
    return sizes


# ---------------------------------------------------------------------------------------------
# torch worker (run by torch's python, spawned ranks)

def _torch_rank(rank, ws, port, params, iters, q):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ws)
    ps = [torch.full((n,), 0.5) for n in tensor_sizes(params, TENSORS)]
    grads = [torch.full((p.numel(),), 1e-3 * ((k + rank) % 7 + 1)) for k, p in enumerate(ps)]
    anchors = [p.detach().clone() for p in ps]
    outer = torch.optim.SGD(ps, lr=0.7, momentum=0.9, nesterov=True)
    inner_lr = 1e-3
    times = []
    for i in range(iters + 2):
        with torch.no_grad():
            for p, g in zip(ps, grads):  # an inner step, as in dopt's benchmark
                p.add_(g, alpha=-inner_lr)
        dist.barrier()
        t0 = time.perf_counter()
        with torch.no_grad():
            # prepare: pseudo-gradients into one buffer, asynchronous all-reduce
            deltas = [a - p for a, p in zip(anchors, ps)]
            buf = torch.cat([d.view(-1) for d in deltas])
            work = dist.all_reduce(buf, async_op=True)
            # sync
            work.wait()
            buf.div_(ws)
            local = [p.detach().clone() for p in ps]
            off = 0
            for p, a in zip(ps, anchors):
                p.copy_(a)
                p.grad = buf[off:off + p.numel()].view_as(p)
                off += p.numel()
        outer.step()
        with torch.no_grad():
            for p, a, l in zip(ps, anchors, local):
                a.copy_(p)
                p.lerp_(l, 0.0)
        outer.zero_grad(set_to_none=True)
        if i >= 2:
            times.append((time.perf_counter() - t0) * 1e3)
    t = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    if rank == 0:
        q.put(t.tolist())
    dist.destroy_process_group()


def torch_worker(ws, params, iters):
    import socket
    import torch.multiprocessing as mp
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_torch_rank, args=(r, ws, port, params, iters, q)) for r in range(ws)]
    for p in procs:
        p.start()
    times = q.get()
    for p in procs:
        p.join()
    print(json.dumps({"benchmark": "diloco_sync", "sync_ms": statistics.median(times),
                      "sync_ms_min": min(times), "iters": iters, "params": params, "tensors": TENSORS,
                      "world_size": ws, "wire": "float32"}), flush=True)


# ---------------------------------------------------------------------------------------------
# driver

def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def launch(cmd, tags):
    l0 = loadavg()
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    recs = []
    for line in p.stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            r = json.loads(line)
            r.update(tags)
            r["load"] = {"loadavg_before": l0, "loadavg_after": loadavg(), "wall_s": time.monotonic() - t0}
            recs.append(r)
    if p.returncode != 0 or not recs:
        sys.stderr.write(f"launch failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout}\n{p.stderr}\n")
        return []
    with open(OUT, "a") as f:
        for r in recs:
            f.write(json.dumps(r) + "\n")
    return recs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--build", default="build")
    ap.add_argument("--params", type=int, default=10_000_000)
    ap.add_argument("--iters", type=int, default=6)
    ap.add_argument("--torch-worker", action="store_true")
    ap.add_argument("--summary-only", action="store_true", help="summarise the latest session in the JSON lines")
    ap.add_argument("--ws", type=int, default=2)
    a = ap.parse_args()
    if a.torch_worker:
        torch_worker(a.ws, a.params, a.iters)
        return
    if a.summary_only:
        rows = [json.loads(l) for l in open(OUT)]
        last = rows[-1]["session"]
        summarize([r for r in rows if r.get("session") == last], last)
        return
    py = os.environ.get("PY", "/usr/bin/python3")
    run_id = datetime.datetime.utcnow().strftime("%Y-%m-%dT%H:%M:%SZ")
    dopt_run = os.path.join(a.build, "tools", "dopt-run")
    bench = os.path.join(a.build, "bench", "dopt_bench_diloco")
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    rows = []
    for run in range(a.runs):
        for ws in WORLD_SIZES:
            tags = {"session": run_id, "run": run}
            rows += launch([py, os.path.abspath(__file__), "--torch-worker", "--ws", str(ws), "--params",
                            str(a.params), "--iters", str(a.iters)], dict(tags, impl="torch"))
            for wire in ("float32", "int8"):
                rows += launch([dopt_run, "--nproc-per-node", str(ws), "--master-port", "0", "--no-prefix", bench,
                                "--mode", "sync", "--params", str(a.params), "--iters", str(a.iters),
                                "--wire", wire], dict(tags, impl="dopt"))
        for sleep in (0, 60):
            for delay in (0, 2):
                rows += launch([dopt_run, "--nproc-per-node", "2", "--master-port", "0", "--no-prefix", bench,
                                "--mode", "overlap", "--params", str(a.params), "--sync-every", "4", "--delay",
                                str(delay), "--rounds", "4", "--inner-sleep-ms", str(sleep)], dict(tags, impl="dopt"))
    summarize([r for r in rows if r.get("session") == run_id], run_id)


def summarize(rows, run_id):
    def med(sel, key):
        v = [r[key] for r in rows if all(r.get(k) == x for k, x in sel.items())]
        return (statistics.median(v), len(v)) if v else (None, 0)

    loads = [r["load"]["loadavg_before"] for r in rows] + [r["load"]["loadavg_after"] for r in rows]
    out = [f"Session {run_id}: 1-min load average {min(loads):.1f}-{max(loads):.1f} "
           f"(median {statistics.median(loads):.1f}) on {os.cpu_count()} CPUs.", ""]
    out.append("| ws | torch sync_ms (float32) | dopt sync_ms (float32) | dopt/torch | dopt sync_ms (int8) | "
               "int8/torch | runs (t/d/d8) |")
    out.append("|---|---|---|---|---|---|---|")
    for ws in WORLD_SIZES:
        t, nt = med({"impl": "torch", "benchmark": "diloco_sync", "world_size": ws}, "sync_ms")
        d, nd = med({"impl": "dopt", "benchmark": "diloco_sync", "world_size": ws, "wire": "float32"}, "sync_ms")
        q, nq = med({"impl": "dopt", "benchmark": "diloco_sync", "world_size": ws, "wire": "int8"}, "sync_ms")
        if t and d and q:
            out.append(f"| {ws} | {t:.1f} | {d:.1f} | {d / t:.2f} | {q:.1f} | {q / t:.2f} | {nt}/{nd}/{nq} |")
    out.append("")
    out.append("| wire | bytes per sync per rank (ws 4) | DDP bytes per step | DDP / DiLoCo per inner step at H = 100 |")
    out.append("|---|---|---|---|")
    for wire in ("float32", "int8"):
        sel = [r for r in rows if r.get("impl") == "dopt" and r.get("benchmark") == "diloco_sync"
               and r.get("world_size") == 4 and r.get("wire") == wire]
        if sel:
            r = sel[-1]
            out.append(f"| {wire} | {r['bytes_per_sync']:.0f} | {r['ddp_bytes_per_step']} | "
                       f"{r['ddp_over_diloco_bytes_per_inner_step_h100']:.1f}x |")
    out.append("")
    out.append("| ws | H | inner step | inner steps (ms per round) | exposed sync, delay 0 (ms) | "
               "exposed sync, delay 2 (ms) | wait at sync, delay 0 / 2 (ms) | average hidden | runs |")
    out.append("|---|---|---|---|---|---|---|---|---|")
    for sleep in (0, 60):
        e0, n0 = med({"benchmark": "diloco_overlap", "delay": 0, "inner_sleep_ms": sleep}, "exposed_ms")
        e2, n2 = med({"benchmark": "diloco_overlap", "delay": 2, "inner_sleep_ms": sleep}, "exposed_ms")
        i0, _ = med({"benchmark": "diloco_overlap", "delay": 0, "inner_sleep_ms": sleep}, "inner_ms")
        w0, _ = med({"benchmark": "diloco_overlap", "delay": 0, "inner_sleep_ms": sleep}, "wait_ms")
        w2, _ = med({"benchmark": "diloco_overlap", "delay": 2, "inner_sleep_ms": sleep}, "wait_ms")
        if e0 is not None and e2 is not None:
            share = 1 - w2 / w0 if w0 > 0 else float("nan")
            kind = "SGD on the CPU" if sleep == 0 else f"SGD + {sleep} ms sleep"
            out.append(f"| 2 | 4 | {kind} | {i0:.1f} | {e0:.1f} | {e2:.1f} | {w0:.1f} / {w2:.1f} | {share:.2f} | "
                       f"{n0}/{n2} |")
    out.append("")
    out.append("exposed sync = round time - the same inner steps without DiLoCo (both medians): the outer step, "
               "deltas and parameter reset stay on the critical path; 'average hidden' = 1 - wait(delay 2) / "
               "wait(delay 0), the share of the average's time taken off the sync.")
    text = "\n".join(out) + "\n"
    with open(SUMMARY, "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
