#!/usr/bin/python3
"""Runs dopt_bench_sim_scale at several world sizes (one process each, so that
each peak RSS is its own) and writes the plot of docs/testing.md (SVG) and a
Markdown table (stdout).

  bench/plot_sim_scale.py BUILD/bench/dopt_bench_sim_scale [--ranks 64,256,1024,4096]
                          [--svg docs/sim-scale.svg] [--json results.jsonl] [--from results.jsonl]
                          [--before earlier.jsonl]

--from draws the lines of an earlier --json instead of running the tool.
--before also draws the lines of an earlier run (grey), to compare with.
Each line records the machine's 1-minute load average when its run began
(load_1m), since the time depends on what else the machine runs.
"""
import argparse
import json
import math
import os
import subprocess
import sys


def run(tool, ranks):
    load = os.getloadavg()[0]
    out = subprocess.run([tool, "--ranks", str(ranks)], check=True, capture_output=True, text=True).stdout
    row = json.loads(out.strip().splitlines()[-1])
    row["load_1m"] = round(load, 2)
    return row


def read(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def panel(x0, y0, w, h, rows, key, title, unit, before=()):
    """One log-log panel: the measurements, a line of slope 1 through the
    first, and (grey) those of an earlier run."""
    xs = [r["ranks"] for r in rows]
    ys = [r[key] for r in rows]
    old = [(r["ranks"], r[key]) for r in before if xs[0] <= r["ranks"] <= xs[-1]]
    lx0, lx1 = math.log10(xs[0] / 1.5), math.log10(xs[-1] * 1.5)
    ly0 = math.log10(min(ys + [y for _, y in old]) / 2)
    ly1 = math.log10(max(max(ys + [y for _, y in old]), ys[0] * xs[-1] / xs[0]) * 2)
    px = lambda x: x0 + (math.log10(x) - lx0) / (lx1 - lx0) * w
    py = lambda y: y0 + h - (math.log10(y) - ly0) / (ly1 - ly0) * h
    s = [f'<rect x="{x0}" y="{y0}" width="{w}" height="{h}" fill="none" stroke="#999"/>',
         f'<text x="{x0 + w / 2}" y="{y0 - 10}" text-anchor="middle" font-weight="bold">{title}</text>']
    for x in xs:
        s.append(f'<line x1="{px(x):.1f}" y1="{y0 + h}" x2="{px(x):.1f}" y2="{y0 + h + 5}" stroke="#333"/>')
        s.append(f'<text x="{px(x):.1f}" y="{y0 + h + 18}" text-anchor="middle">{x}</text>')
    for e in range(math.floor(ly0), math.ceil(ly1) + 1):
        v = 10 ** e
        if ly0 <= e <= ly1:
            s.append(f'<line x1="{x0}" y1="{py(v):.1f}" x2="{x0 + w}" y2="{py(v):.1f}" stroke="#eee"/>')
            s.append(f'<text x="{x0 - 6}" y="{py(v) + 4:.1f}" text-anchor="end">{v:g} {unit}</text>')
    lin = " ".join(f"{px(x):.1f},{py(ys[0] * x / xs[0]):.1f}" for x in (xs[0], xs[-1]))
    s.append(f'<polyline points="{lin}" fill="none" stroke="#999" stroke-dasharray="5,4"/>')
    if old:
        pts = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in old)
        s.append(f'<polyline points="{pts}" fill="none" stroke="#aaa" stroke-width="2"/>')
        for x, y in old:
            s.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="#aaa"/>')
    pts = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in zip(xs, ys))
    s.append(f'<polyline points="{pts}" fill="none" stroke="#2b6cb0" stroke-width="2"/>')
    for x, y in zip(xs, ys):
        s.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="4" fill="#2b6cb0"/>')
        label = f"{y:.0f}" if y >= 100 else f"{y:.3g}"
        s.append(f'<text x="{px(x) - 7:.1f}" y="{py(y) - 9:.1f}" text-anchor="end">{label}</text>')
    s.append(f'<text x="{x0 + w / 2}" y="{y0 + h + 38}" text-anchor="middle">simulated ranks</text>')
    return s


def svg(rows, before=()):
    w, h = 960, 420
    s = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" '
         'font-family="sans-serif" font-size="12">', '<rect width="100%" height="100%" fill="white"/>',
         f'<text x="20" y="26" font-size="15" font-weight="bold">One ZeRO step (Adam, {rows[0]["params"]} float32 '
         'per rank) of deterministic simulated ranks in one process</text>',
         '<text x="20" y="46" fill="#555">blue: measured (dopt_bench_sim_scale, 2-core machine); '
         'dashed: linear in ranks from the first point' + ('; grey: the run before' if before else '') + '</text>']
    s += panel(110, 90, 330, 250, rows, "seconds", "real time of simulate()", "s", before)
    s += panel(600, 90, 330, 250, rows, "peak_rss_mib", "peak RSS of the process", "MiB", before)
    s.append("</svg>")
    return "\n".join(s) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tool")
    ap.add_argument("--ranks", default="64,256,1024,4096")
    ap.add_argument("--svg", default="docs/sim-scale.svg")
    ap.add_argument("--json", help="also append the JSON lines here")
    ap.add_argument("--from", dest="source", help="the JSON lines of an earlier run (the tool is not run)")
    ap.add_argument("--before", help="the JSON lines of an earlier run, drawn in grey")
    a = ap.parse_args()
    rows = read(a.source) if a.source else []
    before = read(a.before) if a.before else []
    for n in ([] if a.source else (int(x) for x in a.ranks.split(","))):
        r = run(a.tool, n)
        print(json.dumps(r), file=sys.stderr)
        if a.json:
            with open(a.json, "a") as f:
                f.write(json.dumps(r) + "\n")
        rows.append(r)
    with open(a.svg, "w") as f:
        f.write(svg(rows, before))
    print("| ranks | time (s) | peak RSS (MiB) | RSS per rank (KiB) | scheduling points | time per rank (ms) | load |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        load = f'{r["load_1m"]:.1f}' if "load_1m" in r else "-"
        print(f'| {r["ranks"]} | {r["seconds"]:.2f} | {r["peak_rss_mib"]:.0f} | {r["rss_per_rank_kib"]:.0f} | '
              f'{r["points"]} | {1000 * r["seconds"] / r["ranks"]:.2f} | {load} |')


if __name__ == "__main__":
    main()
