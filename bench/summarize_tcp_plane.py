#!/usr/bin/env python3
"""Table of bench/compare_tcp_plane.sh's output: algbw (GB/s) per world size,
op and size for gloo, dopt before the change (when timed) and dopt's TCP plane
per DOPT_TCP_STREAMS, with the ratios to gloo and to streams 0.

    python3 bench/summarize_tcp_plane.py OUT.jsonl
"""
import collections
import json
import sys


def main(path):
    rows = collections.defaultdict(dict)
    loads = []
    for line in open(path):
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if "algbw_gbs" not in r:
            continue
        impl = r["impl"] if r["impl"] != "dopt_tcp" else "s%d" % r["streams"]
        rows[(r["world_size"], r["op"], r["bytes"])][impl] = r["algbw_gbs"]
        loads.append(float(r["loadavg_before"]))
    impls = ["gloo", "dopt_tcp_before"] + sorted({k for v in rows.values() for k in v if k.startswith("s")},
                                                  key=lambda s: int(s[1:]))
    impls = [i for i in impls if any(i in v for v in rows.values())]
    streams = [i for i in impls if i.startswith("s")]
    head = ["ranks", "op", "size"] + [i.replace("dopt_tcp_before", "before").replace("s", "streams ", 1)
                                      if i.startswith("s") else i.replace("dopt_tcp_before", "before")
                                      for i in impls]
    head += ["best / gloo", "best streams / streams 0"] if streams else []
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for (ws, op, b), v in sorted(rows.items()):
        cells = [str(ws), op, "%d MiB" % (b >> 20) if b >= 1 << 20 else "%d KiB" % (b >> 10)]
        cells += ["%.3f" % v[i] if i in v else "-" for i in impls]
        if streams:
            striped = [v[s] for s in streams if s != "s0" and s in v]
            best = max(striped) if striped else None
            cells.append("%.2f" % (best / v["gloo"]) if best and v.get("gloo") else "-")
            cells.append("%.2f" % (best / v["s0"]) if best and v.get("s0") else "-")
        print("| " + " | ".join(cells) + " |")
    if loads:
        print("\nload average before the launches: %.1f-%.1f" % (min(loads), max(loads)))


if __name__ == "__main__":
    main(sys.argv[1])
