#!/usr/bin/env python3
"""Table of bench/compare_collectives.sh's output (markdown, for docs/performance.md).

  python3 bench/summarize_collectives.py bench/results/collectives_compare.jsonl

Cells: time per op in microseconds, the median over runs of
  dopt, dopt_sim: median over timed calls of the slowest rank's time (median_us);
  gloo, mpi_*:    the baselines' 'us_median' (median single-op time, max over ranks),
the same statistic. 'memcpy' is the time to copy the bytes once at STREAM's
copy rate (--copy-gbs, default 36.5 GB/s: ../shared/baselines/RESULTS.md, 1 thread,
which counts read + write, so memcpy(N) takes 2N / rate).
"""
import argparse
import collections
import json
import statistics

IMPLS = ["dopt", "dopt_sim", "gloo", "mpi_shm", "mpi_tcp"]


def fmt_size(b):
    for unit, f in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= f:
            return f"{b // f} {unit}"
    return f"{b} B"


def fmt_us(us):
    if us is None:
        return "-"
    return f"{us / 1000:.2f} ms" if us >= 1000 else f"{us:.0f} µs"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("jsonl")
    ap.add_argument("--copy-gbs", type=float, default=36.5)
    args = ap.parse_args()
    cells = collections.defaultdict(list)
    loads = []
    for line in open(args.jsonl):
        line = line.strip()
        if not line.startswith("{"):
            continue
        rec = json.loads(line)
        impl = rec.get("impl")
        if impl not in IMPLS:
            continue
        us = rec.get("median_us", rec.get("us_median"))
        if us is None:
            continue
        cells[(rec["op"], rec["world_size"], rec["bytes"], impl)].append(us)
        if "load" in rec:
            loads.append(rec["load"].get("foreign_frac", 0.0))
    keys = sorted({(op, ws, b) for (op, ws, b, _) in cells}, key=lambda k: (k[0], k[1], k[2]))
    print("| op | ranks | bytes | dopt (processes) | dopt (simulated) | gloo | OpenMPI shm | OpenMPI tcp | memcpy | dopt / gloo | dopt / OpenMPI shm | dopt sim / memcpy |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for op, ws, b in keys:
        if not cells.get((op, ws, b, "dopt")) and not cells.get((op, ws, b, "dopt_sim")):
            continue  # a baseline-only row (e.g. OpenMPI's reduce_scatter)
        med = {i: (statistics.median(cells[(op, ws, b, i)]) if cells.get((op, ws, b, i)) else None) for i in IMPLS}
        memcpy_us = 2 * b / (args.copy_gbs * 1e3)
        ratio = lambda x, y: f"{x / y:.2f}" if x and y else "-"
        print(f"| {op} | {ws} | {fmt_size(b)} | {fmt_us(med['dopt'])} | {fmt_us(med['dopt_sim'])} | {fmt_us(med['gloo'])} | "
              f"{fmt_us(med['mpi_shm'])} | {fmt_us(med['mpi_tcp'])} | {fmt_us(memcpy_us)} | {ratio(med['dopt'], med['gloo'])} | "
              f"{ratio(med['dopt'], med['mpi_shm'])} | {ratio(med['dopt_sim'], memcpy_us)} |")
    n = max(len(v) for v in cells.values()) if cells else 0
    if loads:
        print(f"\nRuns per cell: up to {n}; foreign CPU load per launch: median {statistics.median(loads):.3f}, "
              f"max {max(loads):.3f}.")


if __name__ == "__main__":
    main()
