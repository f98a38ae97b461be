#!/usr/bin/env python3
"""Tables of bench/compare_collectives.sh's output (markdown, for docs/performance.md).

  python3 bench/summarize_collectives.py bench/results/collectives_compare.jsonl

Cells: time per op, the median over runs of
  dopt, dopt_sim: median over timed calls of the slowest rank's time (median_us);
  gloo, mpi_*:    the baselines' 'us_median' (median single-op time, max over ranks);
  memcpy:         one rank copying the bytes once (median), measured in the same run.
'floor' (simulated ranks): n ranks must read and write 2 * n * S bytes in all, i.e.
n memcpys of S at the measured copy rate. Targets (dopt with processes against
OpenMPI over shared memory): 4 KiB within 2x, 1 MiB at most 1x, 64 MiB at most 0.8x.
"""
import argparse
import collections
import json
import statistics

IMPLS = ["dopt", "dopt_sim", "gloo", "mpi_shm", "mpi_tcp", "memcpy"]
TARGET = {4096: 2.0, 1 << 20: 1.0, 64 << 20: 0.8}


def fmt_size(b):
    for unit, f in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= f:
            return f"{b // f} {unit}"
    return f"{b} B"


def fmt_us(us):
    if us is None:
        return "-"
    if us >= 1000:
        return f"{us / 1000:.2f} ms"
    return f"{us:.1f} µs" if us < 10 else f"{us:.0f} µs"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("jsonl")
    args = ap.parse_args()
    cells = collections.defaultdict(list)
    rss = collections.defaultdict(list)
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
        ws = rec["world_size"] if impl != "memcpy" else 1
        cells[(rec["op"], ws, rec["bytes"], impl)].append(us)
        if impl in ("dopt", "dopt_sim") and "extra_rss_mib" in rec:
            rss[(rec["op"], ws, rec["bytes"], impl)].append(rec["extra_rss_mib"])
        if "load" in rec:
            loads.append(rec["load"].get("foreign_frac", 0.0))
    med = lambda k: statistics.median(cells[k]) if cells.get(k) else None
    ratio = lambda x, y: f"{x / y:.2f}" if x and y else "-"
    keys = sorted({(op, ws, b) for (op, ws, b, i) in cells if i in ("dopt", "dopt_sim") and op != "barrier"})
    print("| op | ranks | bytes | dopt (processes) | OpenMPI shm | dopt / OpenMPI shm | target | gloo | dopt / gloo "
          "| OpenMPI tcp | dopt (simulated) | floor | simulated / floor | extra memory |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for op, ws, b in keys:
        d, ds, g = med((op, ws, b, "dopt")), med((op, ws, b, "dopt_sim")), med((op, ws, b, "gloo"))
        ms, mt = med((op, ws, b, "mpi_shm")), med((op, ws, b, "mpi_tcp"))
        mc = med(("memcpy", 1, b, "memcpy"))
        floor = ws * mc if mc else None
        target = f"≤ {TARGET[b]:g}x" if b in TARGET else ""
        extra = rss.get((op, ws, b, "dopt"))
        extra_s = f"{max(extra):.0f} MiB" if extra else "-"
        print(f"| {op} | {ws} | {fmt_size(b)} | {fmt_us(d)} | {fmt_us(ms)} | {ratio(d, ms)} | {target} | {fmt_us(g)} | "
              f"{ratio(d, g)} | {fmt_us(mt)} | {fmt_us(ds)} | {fmt_us(floor)} | {ratio(ds, floor)} | {extra_s} |")
    bars = sorted({ws for (op, ws, b, i) in cells if op == "barrier"})
    if bars:
        print("\n| barrier | ranks | dopt (processes) | dopt (simulated) |")
        print("|---|---|---|---|")
        for ws in bars:
            print(f"| barrier | {ws} | {fmt_us(med(('barrier', ws, 4, 'dopt')))} | {fmt_us(med(('barrier', ws, 4, 'dopt_sim')))} |")
    n = max(len(v) for v in cells.values()) if cells else 0
    if loads:
        print(f"\nRuns per cell: up to {n}; foreign CPU load per launch: median {statistics.median(loads):.3f}, "
              f"max {max(loads):.3f}.")


if __name__ == "__main__":
    main()
