#!/usr/bin/python3
"""dopt's clip_grad_norm vs torch 1.13's clip_grad_norm_, measured in the same run.

For each (numel, tensors, threads, clip) it times torch.nn.utils.clip_grad_norm_
(torch.set_num_threads(threads)) and runs dopt_bench_optim's
ClipGradNorm/<numel>/<tensors>/<threads>/<clip|noclip> (ClipGradNormOptions::
num_threads = threads), alternating the two a few rounds so both see the
same machine state. The gradients are restored before every call, outside
the timed region, on both sides. "clip" uses max_norm 1 (the coefficient is
below 1: every gradient is scaled); "noclip" uses max_norm 1e30 (torch still
multiplies every gradient by 1.0; dopt skips that multiplication, which
changes no bit). Prints a Markdown table and appends JSON lines.

  /usr/bin/python3 bench/compare_clip_grad_torch.py --bench build/bench/dopt_bench_optim \\
      --out bench/results/clip_grad_vs_torch.jsonl
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def torch_clip_ms(torch, numel, tensors, threads, max_norm, target_s=0.5):
    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(0)
    base, rem = divmod(numel, tensors)
    params, saved = [], []
    for i in range(tensors):
        p = torch.nn.Parameter(torch.rand(base + (1 if i < rem else 0), generator=gen))
        p.grad = torch.randn(p.numel(), generator=gen).mul_(1e-3)
        params.append(p)
        saved.append(p.grad.clone())

    def once():
        for p, s in zip(params, saved):
            p.grad.copy_(s)
        t0 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(params, max_norm)
        return time.perf_counter() - t0

    once()
    est = once()
    k = max(5, min(200, int(target_s / max(est, 1e-6))))
    return 1e3 * statistics.median(once() for _ in range(k))


def dopt_clip_ms(bench, numel, tensors, threads, clip):
    filt = f"^ClipGradNorm/{numel}/{tensors}/{threads}/{'clip' if clip else 'noclip'}/"
    out = subprocess.run([bench, f"--benchmark_filter={filt}", "--benchmark_format=json",
                          "--benchmark_repetitions=3", "--benchmark_report_aggregates_only=true"],
                         check=True, capture_output=True, text=True).stdout
    med = [b for b in json.loads(out)["benchmarks"] if b.get("aggregate_name") == "median"]
    if not med:
        raise SystemExit(f"no result for {filt}")
    b = med[0]
    return b["real_time"] * {"ms": 1.0, "us": 1e-3, "ns": 1e-6, "s": 1e3}[b["time_unit"]]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", required=True)
    ap.add_argument("--out", default=None)
    ap.add_argument("--numel", type=int, default=10_000_000)
    ap.add_argument("--tensors", default="100,1")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    import torch
    rows = []
    for k in map(int, args.tensors.split(",")):
        for th in map(int, args.threads.split(",")):
            for clip in (True, False):
                t_ms, d_ms = [], []
                for _ in range(args.rounds):
                    t_ms.append(torch_clip_ms(torch, args.numel, k, th, 1.0 if clip else 1e30))
                    d_ms.append(dopt_clip_ms(args.bench, args.numel, k, th, clip))
                t, d = statistics.median(t_ms), statistics.median(d_ms)
                row = dict(op="clip_grad_norm", numel=args.numel, tensors=k, threads=th,
                           clipping=clip, torch_ms=round(t, 4), dopt_ms=round(d, 4), speedup=round(t / d, 2),
                           torch_rounds_ms=[round(x, 3) for x in t_ms], dopt_rounds_ms=[round(x, 3) for x in d_ms],
                           torch=torch.__version__, date=time.strftime("%Y-%m-%d"))
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
                if args.out:
                    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
                    with open(args.out, "a") as f:
                        f.write(json.dumps(row) + "\n")
    print("| numel | tensors | threads | gradients scaled | torch 1.13 ms | dopt ms | speedup |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['numel']:,} | {r['tensors']} | {r['threads']} | {'yes' if r['clipping'] else 'no (coef 1)'} | "
              f"{r['torch_ms']} | {r['dopt_ms']} | {r['speedup']}x |")


if __name__ == "__main__":
    main()
