#!/usr/bin/env python3
"""Summary of a device check run (gpu/device_check/run.sh): the status of
each step, the benchmark table (dopt's fused steps against torch's fused and
foreach optimizers on the same GPU, and against the device copy bandwidth
measured in the same run), the bitwise step checks, and the same table in
Markdown for docs/performance.md. Only what the run measured is printed.

Usage: summarize.py RESULTS_DIR"""
import json
import os
import sys


def rows(path):
    out = []
    if os.path.exists(path):
        for line in open(path, encoding="utf-8", errors="replace"):
            line = line.strip()
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
    return out


def first_line(path, prefix):
    if not os.path.exists(path):
        return None
    for line in open(path, encoding="utf-8", errors="replace"):
        if line.startswith(prefix):
            return line[len(prefix):].strip()
    return None


def main(d):
    status = os.path.join(d, "status.txt")
    print(open(status, encoding="utf-8").read().rstrip() if os.path.exists(status) else "(no status)")
    machine = os.path.join(d, "machine.txt")
    gpu_line, date = None, first_line(machine, "date:")
    if os.path.exists(machine):
        lines = [l.strip() for l in open(machine, encoding="utf-8", errors="replace")]
        gpu_line = next((l for l in lines if l[:1].isdigit() and "," in l), None)
        torch_line = next((l for l in lines if l.startswith("torch ")), None)
    else:
        torch_line = None
    print()
    dopt = rows(os.path.join(d, "dopt_bench.jsonl"))
    torch = rows(os.path.join(d, "torch_bench.jsonl"))
    if any(r.get("bench") == "none" for r in dopt):
        print("dopt benchmarks: no CUDA device")
        return 0
    copies = [r for r in dopt if r.get("bench") == "copy"]
    copy_best = max((r["gb_per_s"] for r in copies), default=None)
    for r in copies:
        print(f"copy {r['method']:<20} {r['bytes'] / 2**30:.0f} GiB: {r['gb_per_s']:.1f} GB/s (read + write)")
    steps = [r for r in dopt if r.get("bench") == "fused_step"]
    tsteps = {(r["optimizer"], r["params"], r["impl"]): r for r in torch
              if r.get("bench") == "torch_step" and "ms_per_step" in r}
    table = []
    for r in steps:
        f = tsteps.get((r["optimizer"], r["params"], "fused"))
        e = tsteps.get((r["optimizer"], r["params"], "foreach"))
        table.append({
            "optimizer": r["optimizer"], "params": r["params"], "ms": r["ms_per_step"], "gbps": r["gb_per_s"],
            "of_copy": (r["gb_per_s"] / copy_best) if copy_best else None,
            "torch_fused": f["ms_per_step"] if f else None, "torch_foreach": e["ms_per_step"] if e else None,
        })
    if table:
        print()
        print(f"{'step':<5} {'params':>11} {'dopt ms':>9} {'GB/s':>8} {'of copy':>8} {'torch fused ms':>15} "
              f"{'torch foreach ms':>17} {'fused/dopt':>11}")
        for t in table:
            oc = f"{100 * t['of_copy']:.0f}%" if t["of_copy"] is not None else "-"
            tf = f"{t['torch_fused']:.3f}" if t["torch_fused"] is not None else "-"
            te = f"{t['torch_foreach']:.3f}" if t["torch_foreach"] is not None else "-"
            sp = f"{t['torch_fused'] / t['ms']:.2f}x" if t["torch_fused"] is not None else "-"
            print(f"{t['optimizer']:<5} {t['params']:>11} {t['ms']:>9.3f} {t['gbps']:>8.1f} {oc:>8} {tf:>15} {te:>17} "
                  f"{sp:>11}")
    for r in torch:
        if r.get("bench") == "torch":
            print("torch:", r.get("skipped"))
        if r.get("bench") == "torch_step" and "skipped" in r:
            print(f"torch {r['optimizer']} {r['impl']}: {r['skipped']}")
    for r in dopt:
        if r.get("bench") == "step_check":
            print(f"step check {r['optimizer']} {r['params']}: {r['checked_elements']} elements after {r['steps']} "
                  f"steps, {r['mismatches']} differ from the CPU optimizer -> {'ok' if r['ok'] else 'FAILED'}")
        if r.get("bench") == "fused_step_streams":
            print(f"Adam {r['params']} params as two halves on {r['streams']} stream(s): {r['ms_per_step']:.3f} ms")
        if r.get("bench") == "nccl_all_reduce" and "skipped" in r:
            print("nccl all_reduce:", r["skipped"])
    if table:
        print()
        print("Markdown for docs/performance.md:")
        print()
        print(f"Measured {date or '?'} on {gpu_line or '?'}; {torch_line or 'torch: not available'}; "
              f"copy bandwidth {copy_best:.0f} GB/s (read + write)." if copy_best else "")
        print()
        print("| step | parameters | dopt ms | dopt GB/s | of copy bandwidth | torch fused ms | torch foreach ms | "
              "torch fused / dopt |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for t in table:
            oc = f"{100 * t['of_copy']:.0f}%" if t["of_copy"] is not None else "-"
            tf = f"{t['torch_fused']:.3f}" if t["torch_fused"] is not None else "-"
            te = f"{t['torch_foreach']:.3f}" if t["torch_foreach"] is not None else "-"
            sp = f"{t['torch_fused'] / t['ms']:.2f}" if t["torch_fused"] is not None else "-"
            print(f"| {t['optimizer']} | {t['params']:,} | {t['ms']:.3f} | {t['gbps']:.0f} | {oc} | {tf} | {te} | {sp} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
