#!/usr/bin/env python3
"""Table of bench/compare_multihost.sh's results: algbw GB/s (bytes / time per
call) per implementation, for each layout, op and size; raw TCP is the rate
per direction with both hosts sending at once (an all_reduce between two hosts
moves its whole tensor each way, so raw TCP bounds its algbw; all_gather moves
half, so twice raw TCP bounds it). raw TCP is timed two ways (a thread per
direction and connection, one thread polling them all); the faster is the limit.

  summarize.py OUT.jsonl
"""
import json
import sys
from collections import defaultdict

IMPLS = ["dopt", "gloo", "mpi_tcp", "dopt_mpi", "raw_tcp"]
rows = defaultdict(dict)
raw = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    per = r["per_host"]
    if r["impl"] == "raw_tcp":
        # the faster of its ways (threads, poll) is the limit
        raw[(per, r["bytes"])] = max(raw.get((per, r["bytes"]), 0), r["gbs_per_direction"])
        continue
    if r.get("op") not in ("all_reduce", "all_gather"):
        continue
    rows[(per, r["op"], r["bytes"])][r["impl"]] = r["algbw_gbs"]


def size(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"


print("| hosts x ranks | op | size | dopt | gloo | OpenMPI tcp | dopt over MPI | raw TCP (limit) | dopt / gloo | dopt / OpenMPI | dopt / limit |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for (per, op, b) in sorted(rows):
    v = rows[(per, op, b)]
    lim = raw.get((per, b))
    if lim is not None and op == "all_gather":
        lim *= 2
    cells = [f"{v[i]:.3f}" if i in v else "-" for i in IMPLS[:4]]
    cells.append(f"{lim:.3f}" if lim else "-")

    def ratio(a, c):
        return f"{a / c:.2f}" if a and c else "-"

    cells += [ratio(v.get("dopt"), v.get("gloo")), ratio(v.get("dopt"), v.get("mpi_tcp")), ratio(v.get("dopt"), lim)]
    print(f"| 2 x {per} | {op} | {size(b)} | " + " | ".join(cells) + " |")
