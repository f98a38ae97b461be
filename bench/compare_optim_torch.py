#!/usr/bin/python3
"""dopt vs torch 1.13 optimizer step, measured in the same run.

For each (optimizer, numel, tensors) it times torch.optim's step() (one
intra-op thread, foreach=False and True; the faster one is reported) and runs
dopt_bench_optim for the same shape (one thread), alternating the two a few
rounds so both see the same machine state. Prints a Markdown table and writes
all figures as JSON lines.

  /usr/bin/python3 bench/compare_optim_torch.py --bench build/bench/dopt_bench_optim \
      --out bench/results/optim_vs_torch.jsonl [--quick]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

BYTES = {"SGD": 20, "Adam": 28, "AdamW": 28, "Adagrad": 20, "RMSprop": 20,
         "Adamax": 28, "Adadelta": 28, "Rprop": 28, "NAdam": 28, "RAdam": 28}
KW = {"SGD": dict(lr=0.01, momentum=0.9), "Adam": dict(lr=1e-3), "AdamW": dict(lr=1e-3, weight_decay=1e-2),
      "Adagrad": dict(lr=1e-2), "RMSprop": dict(lr=1e-2), "Adamax": dict(lr=2e-3), "Adadelta": dict(lr=1.0),
      "Rprop": dict(lr=1e-2), "NAdam": dict(lr=2e-3), "RAdam": dict(lr=1e-3)}


def torch_step_ms(torch, cls, numel, tensors, foreach, target_s=0.5):
    gen = torch.Generator().manual_seed(0)
    base, rem = divmod(numel, tensors)
    params = []
    for i in range(tensors):
        p = torch.nn.Parameter(torch.rand(base + (1 if i < rem else 0), generator=gen))
        p.grad = torch.randn(p.numel(), generator=gen).mul_(1e-3)
        params.append(p)
    opt = getattr(torch.optim, cls)(params, foreach=foreach, **KW[cls])
    opt.step()
    t0 = time.perf_counter(); opt.step(); est = time.perf_counter() - t0
    k = max(3, min(200, int(target_s / max(est, 1e-6))))
    ts = []
    for _ in range(k):
        t0 = time.perf_counter(); opt.step(); ts.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(ts)


def dopt_step_ms(bench, cls, numel, tensors):
    filt = f"^OptimStep/{cls}/{numel}/{tensors}/"
    out = subprocess.run([bench, f"--benchmark_filter={filt}", "--benchmark_format=json",
                          "--benchmark_repetitions=3", "--benchmark_report_aggregates_only=true"],
                         check=True, capture_output=True, text=True).stdout
    runs = json.loads(out)["benchmarks"]
    med = [b for b in runs if b.get("aggregate_name") == "median"]
    if not med:
        raise SystemExit(f"no result for {filt}")
    b = med[0]
    scale = {"ms": 1.0, "us": 1e-3, "ns": 1e-6, "s": 1e3}[b["time_unit"]]
    return b["real_time"] * scale


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", required=True)
    ap.add_argument("--out", default=None)
    ap.add_argument("--optims", default="SGD,Adam,AdamW,Adagrad,RMSprop,Adamax,Adadelta,Rprop")
    ap.add_argument("--sizes", default="1000000,10000000")
    ap.add_argument("--tensors", default="1,1000")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    import torch
    torch.set_num_threads(1)
    rows = []
    for cls in args.optims.split(","):
        for n in map(int, args.sizes.split(",")):
            for k in map(int, args.tensors.split(",")):
                t_ms, d_ms = [], []
                for _ in range(args.rounds):
                    t_ms.append(min(torch_step_ms(torch, cls, n, k, False), torch_step_ms(torch, cls, n, k, True)))
                    d_ms.append(dopt_step_ms(args.bench, cls, n, k))
                t, d = statistics.median(t_ms), statistics.median(d_ms)
                row = dict(optim=cls, numel=n, tensors=k, threads=1, torch_ms=round(t, 4), dopt_ms=round(d, 4),
                           speedup=round(t / d, 2), bytes_per_elem=BYTES[cls],
                           dopt_gbs=round(BYTES[cls] * n / (d * 1e-3) / 1e9, 2),
                           torch_gbs=round(BYTES[cls] * n / (t * 1e-3) / 1e9, 2), torch=torch.__version__,
                           date=time.strftime("%Y-%m-%d"))
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
                if args.out:
                    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
                    with open(args.out, "a") as f:
                        f.write(json.dumps(row) + "\n")
    print("| optimizer | numel | tensors | torch 1.13 ms | dopt ms | speedup | dopt GB/s | torch GB/s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['optim']} | {r['numel']:,} | {r['tensors']} | {r['torch_ms']} | {r['dopt_ms']} | "
              f"{r['speedup']}x | {r['dopt_gbs']} | {r['torch_gbs']} |")


if __name__ == "__main__":
    main()
