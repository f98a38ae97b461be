#!/usr/bin/env python3
"""Table of bench/compare_cma.sh's output: median over runs of each tool's median time."""
import collections
import json
import statistics
import sys


def main():
    cells = collections.defaultdict(list)
    loads = []
    for line in open(sys.argv[1]):
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        impl = rec.get("impl")
        if impl not in ("dopt_cma", "dopt_staged", "mpi_shm") or rec.get("op") not in ("all_gather", "broadcast"):
            continue
        us = rec.get("median_us", rec.get("us_median"))
        if rec.get("bytes", 0) < (1 << 20) or us is None:
            continue
        cells[(rec["op"], rec["world_size"], rec["bytes"], impl)].append(us)
        if "load" in rec:
            loads.append(rec["load"].get("foreign_frac", 0.0))
    med = lambda k: statistics.median(cells[k]) if cells.get(k) else None
    print("| op | ranks | bytes | dopt, cross-memory | dopt, staged | OpenMPI shm | cross-memory / staged | cross-memory / OpenMPI |")
    print("|---|---|---|---|---|---|---|---|")
    for op, ws, b in sorted({k[:3] for k in cells}):
        c, s, m = med((op, ws, b, "dopt_cma")), med((op, ws, b, "dopt_staged")), med((op, ws, b, "mpi_shm"))
        f = lambda x: "-" if x is None else f"{x / 1000:.2f} ms"
        r = lambda x, y: "-" if x is None or y is None else f"{x / y:.2f}"
        print(f"| {op} | {ws} | {b >> 20} MiB | {f(c)} | {f(s)} | {f(m)} | {r(c, s)} | {r(c, m)} |")
    if loads:
        print(f"\nRuns per cell: up to {max(len(v) for v in cells.values())}; foreign CPU load per launch: "
              f"median {statistics.median(loads):.3f}, max {max(loads):.3f}.")


if __name__ == "__main__":
    main()
