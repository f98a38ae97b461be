#!/usr/bin/env python3
"""ZeroRedundancyOptimizer(Adam): dopt vs torch 1.13, interleaved, in one run.

  python3 bench/compare_zero_torch.py run [--runs 3] [--build build] [--out bench/results/zero_compare.jsonl]
  python3 bench/compare_zero_torch.py summary [--in bench/results/zero_compare.jsonl]

`run`: for each run 1..RUNS, world size WS in (2, 4) and N in (10M, 50M)
elements in 100 tensors, launches one after the other
  torch plain Adam, torch ZeRO bucket_view=False, torch ZeRO bucket_view=True
      (/work/shared/baselines/zero/bench_zero.py, gloo, 1 intra-op thread per rank),
  dopt ZeRO bucket_view off and on
      (dopt-run --nproc-per-node WS --master-port 0 BUILD/bench/dopt_bench_zero
       --params N --tensors 100 --optimizer adam [--bucket-view]),
with the same step counts as the baseline's run.sh (10 steps at 10M, 6 at 50M,
2 warm-up steps, a barrier before each step, per step the max over ranks, the
median over steps) and the same tensor sizes (proportional to 1..10). Each
JSON record a launch prints is appended to --out with:
  impl ("torch" / "dopt"), mode ("plain" / "zero"), bucket_view, world_size,
  numel, run, and "load": the machine's load average (os.getloadavg) before
  and after, the foreign CPU fraction during the launch measured as
  /work/shared/baselines/launch.py does (busy jiffies of the machine minus the
  launch's own CPU time, over wall time x CPUs), the wall time and the command.
The machine is shared: nothing waits for it to be quiet (--quiet-wait can),
the load is recorded instead.

`summary`: a markdown table over the records of --in: medians over runs of the
step time (ms), the optimizer state per rank (MiB, max over ranks) and the
peak RSS (MiB, max over ranks), dopt/torch ratios, and the issue's targets
(step time <= 0.5 x torch; state per rank <= 1.05 x (total / WS + the largest
parameter's state)).
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BASELINES = "/work/shared/baselines"
PY = "/usr/bin/python3"
HZ = os.sysconf("SC_CLK_TCK")
NCPU = os.cpu_count()
MIB = 2 ** 20


def busy_jiffies():  # as launch.py
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return sum(v[:8]) - v[3] - v[4] - v[7]


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def sample_frac(seconds=1.0):
    b0, t0 = busy_jiffies(), time.monotonic()
    time.sleep(seconds)
    return (busy_jiffies() - b0) / HZ / ((time.monotonic() - t0) * NCPU)


def launch(cmd, quiet_wait):
    waited = 0.0
    pre = sample_frac(0.5)
    while quiet_wait > 0 and pre > 0.10 and waited < quiet_wait:
        pre = sample_frac(1.0)
        waited += 1.0
    la0 = os.getloadavg()
    c0, b0, t0 = children_cpu(), busy_jiffies(), time.monotonic()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    wall = time.monotonic() - t0
    own = children_cpu() - c0
    busy = (busy_jiffies() - b0) / HZ
    la1 = os.getloadavg()
    recs = []
    for line in p.stdout.splitlines():
        s = line.strip()
        if s.startswith("[rank"):  # dopt-run's prefix
            s = s.split("]", 1)[1].strip()
        if s.startswith("{"):
            try:
                recs.append(json.loads(s))
            except json.JSONDecodeError:
                pass
    if p.returncode != 0 or not recs:
        sys.stderr.write(p.stdout + p.stderr)
        raise SystemExit(f"launch failed (rc {p.returncode}): {' '.join(cmd)}")
    load = dict(loadavg_before=[round(x, 2) for x in la0], loadavg_after=[round(x, 2) for x in la1],
                foreign_frac=round(max(0.0, busy - own) / (wall * NCPU), 3), pre_frac=round(pre, 3),
                waited_s=waited, wall_s=round(wall, 2), ncpu=NCPU,
                cmd=" ".join(os.path.relpath(c, ROOT) if c.startswith(ROOT + os.sep) else c for c in cmd))
    return recs, load


def run(a):
    dopt_run = os.path.join(a.build, "tools", "dopt-run")
    bench = os.path.join(a.build, "bench", "dopt_bench_zero")
    for f in (dopt_run, bench):
        if not os.access(f, os.X_OK):
            raise SystemExit(f"{f}: not built (cmake --build {a.build} --target dopt-run dopt_bench_zero)")
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for r in range(1, a.runs + 1):
        for ws in a.world_sizes:
            for n in a.numels:
                steps = 10 if n <= 10_000_000 else 6
                configs = [
                    ("torch", "plain", None, [PY, f"{BASELINES}/zero/bench_zero.py", "--mode", "plain"]),
                    ("torch", "zero", False, [PY, f"{BASELINES}/zero/bench_zero.py", "--mode", "zero",
                                              "--bucket-view", "0"]),
                    ("dopt", "zero", False, [dopt_run, "--nproc-per-node", str(ws), "--master-port", "0", bench]),
                    ("torch", "zero", True, [PY, f"{BASELINES}/zero/bench_zero.py", "--mode", "zero",
                                             "--bucket-view", "1"]),
                    ("dopt", "zero", True, [dopt_run, "--nproc-per-node", str(ws), "--master-port", "0", bench,
                                            "--bucket-view"]),
                ]
                for impl, mode, bv, base in configs:
                    if impl == "torch":
                        cmd = base + ["--world-size", str(ws), "--numel", str(n), "--tensors", "100",
                                      "--steps", str(steps), "--run", str(r)]
                    else:
                        cmd = base + ["--params", str(n), "--tensors", "100", "--optimizer", "adam",
                                      "--steps", str(steps), "--warmup", "2"]
                    recs, load = launch(cmd, a.quiet_wait)
                    with open(a.out, "a") as f:
                        for rec in recs:
                            rec.update(impl=impl, mode=mode, bucket_view=bv, world_size=ws, numel=n, run=r,
                                       session=started, load=load)
                            f.write(json.dumps(rec) + "\n")
                    ms = recs[0].get("step_ms", recs[0].get("median_ms"))
                    print(f"run {r} ws {ws} n {n // 1_000_000}M {impl} {mode} bv={bv}: {ms} ms "
                          f"(load avg {load['loadavg_before'][0]}, foreign {load['foreign_frac']})", flush=True)


def med(xs):
    return statistics.median(xs) if xs else None


def fmt(x, nd=1):
    if x is None:
        return "-"
    return f"{x:.{nd}f}" if abs(x) < 1000 else f"{x:.0f}"


def quiet_baseline(path=os.path.join(BASELINES, "RESULTS.md")):
    """(ws, numel, bucket_view or None for plain) -> torch step ms median from the baselines' table."""
    out = {}
    if not os.path.exists(path):
        return out
    section = False
    for line in open(path):
        if line.startswith("## "):
            section = line.strip() == "## ZeroRedundancyOptimizer"
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not section or len(cells) < 4 or not cells[0].isdigit():
            continue
        n = int(float(cells[1].rstrip("M")) * 1_000_000)
        bv = None if cells[2] == "plain Adam" else cells[2].endswith("True")
        try:
            out[(int(cells[0]), n, bv)] = float(cells[3].split()[0])
        except ValueError:
            pass
    return out


def summary(a):
    quiet = quiet_baseline()
    recs = [json.loads(l) for l in open(a.inp) if l.strip()]
    if a.session:
        recs = [r for r in recs if r.get("session") == a.session]
    elif recs:  # the latest session by default
        last = max(r.get("session", "") for r in recs)
        recs = [r for r in recs if r.get("session", "") == last]
    by = {}
    for r in recs:
        by.setdefault((r["world_size"], r["numel"], r["mode"], r["bucket_view"], r["impl"]), []).append(r)

    def step_ms(r):
        return r["step_ms"] if r["impl"] == "torch" else r["median_ms"]

    def state_mib(r):
        return max(r["state_mib"]) if r["impl"] == "torch" else r["state_bytes_per_rank"] / MIB

    def rss_mib(r):
        return max(r["peak_rss_mib"]) if r["impl"] == "torch" else r["peak_rss_bytes"] / MIB

    loads = [r["load"]["loadavg_before"][0] for r in recs] + [r["load"]["loadavg_after"][0] for r in recs]
    foreign = [r["load"]["foreign_frac"] for r in recs]
    sessions = sorted({r.get("session", "?") for r in recs})
    print(f"Session {', '.join(sessions)}: {len(recs)} launches on {recs[0]['load']['ncpu']} CPUs; "
          f"1-min load average {min(loads):.2f}-{max(loads):.2f} (median {med(loads):.2f}); foreign CPU "
          f"during a launch median {med(foreign):.2f}, max {max(foreign):.2f}.\n")
    print("| ws | params | optimizer | torch step ms | dopt step ms | dopt/torch | torch state MiB/rank | "
          "dopt state MiB/rank | dopt/torch | dopt state / bound | torch peak RSS MiB | dopt peak RSS MiB | "
          "dopt/torch | torch step ms, quiet machine (RESULTS.md) | dopt/that | runs torch/dopt |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    verdict = []
    for ws in sorted({k[0] for k in by}):
        for n in sorted({k[1] for k in by if k[0] == ws}):
            t = by.get((ws, n, "plain", None, "torch"), [])
            if t:
                print(f"| {ws} | {n // 1_000_000}M | plain Adam (torch only) | {fmt(med([step_ms(r) for r in t]))} | - "
                      f"| - | {fmt(med([state_mib(r) for r in t]))} | - | - | - | "
                      f"{fmt(med([rss_mib(r) for r in t]))} | - | - | {fmt(quiet.get((ws, n, None)))} | - | "
                      f"{len(t)}/- |")
            for bv in (False, True):
                t = by.get((ws, n, "zero", bv, "torch"), [])
                d = by.get((ws, n, "zero", bv, "dopt"), [])
                if not t and not d:
                    continue
                ts, ds = med([step_ms(r) for r in t]), med([step_ms(r) for r in d])
                tm, dm = med([state_mib(r) for r in t]), med([state_mib(r) for r in d])
                tr, dr = med([rss_mib(r) for r in t]), med([rss_mib(r) for r in d])
                bound = med([r["state_bytes_per_rank"] / r["state_bytes_bound"] for r in d]) if d else None
                ratio = (lambda x, y: x / y if x is not None and y else None)
                sr = ratio(ds, ts)
                print(f"| {ws} | {n // 1_000_000}M | ZeRO(Adam) bucket_view={bv} | {fmt(ts)} | {fmt(ds)} | "
                      f"{fmt(sr, 2)} | {fmt(tm)} | {fmt(dm)} | {fmt(ratio(dm, tm), 2)} | {fmt(bound, 3)} | "
                      f"{fmt(tr)} | {fmt(dr)} | {fmt(ratio(dr, tr), 2)} | {fmt(quiet.get((ws, n, bv)))} | "
                      f"{fmt(ratio(ds, quiet.get((ws, n, bv))), 2)} | {len(t)}/{len(d)} |")
                verdict.append((ws, n, bv, sr, bound, ratio(ds, quiet.get((ws, n, bv)))))
    print()
    ok_t = [v for v in verdict if v[3] is not None and v[3] <= 0.5]
    ok_s = [v for v in verdict if v[4] is not None and v[4] <= 1.05]
    ok_q = [v for v in verdict if v[5] is not None and v[5] <= 0.5]
    print(f"Step time <= 0.5 x torch: {len(ok_t)} of {len(verdict)} configurations against torch in this run, "
          f"{len(ok_q)} of {len([v for v in verdict if v[5] is not None])} against torch's quiet-machine figures. "
          f"State per rank <= 1.05 x (total/WS + largest parameter's state): {len(ok_s)} of {len(verdict)}.")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--runs", type=int, default=int(os.environ.get("RUNS", "3")))
    r.add_argument("--build", default=os.environ.get("BUILD", os.path.join(ROOT, "build")))
    r.add_argument("--out", default=os.path.join(HERE, "results", "zero_compare.jsonl"))
    r.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    r.add_argument("--numels", type=int, nargs="+", default=[10_000_000, 50_000_000])
    r.add_argument("--quiet-wait", type=float, default=0.0,
                   help="wait up to this many seconds for foreign CPU < 10%% before each launch (default: no wait)")
    s = sub.add_parser("summary")
    s.add_argument("--in", dest="inp", default=os.path.join(HERE, "results", "zero_compare.jsonl"))
    s.add_argument("--session", default=None, help="only this session (default: the latest)")
    a = ap.parse_args()
    run(a) if a.cmd == "run" else summary(a)


if __name__ == "__main__":
    main()
