#!/usr/bin/env python3
"""ZeRO(Adam) checkpoints: dopt vs torch 1.13, interleaved, in one run.

  python3 bench/compare_checkpoint_torch.py run [--runs 3] [--build build] [--out bench/results/checkpoint_compare.jsonl]
  python3 bench/compare_checkpoint_torch.py summary [--in bench/results/checkpoint_compare.jsonl]

`run`: 2 ranks, --numel float32 parameters (default 50M) in 100 tensors.
First both sides save, once, into a temporary folder (removed at the end):
  torch: bench/checkpoint_torch.py --mode save (consolidate_state_dict + torch.save on rank 0)
  dopt:  dopt-run ... BUILD/bench/dopt_bench_checkpoint_load --mode save
         (consolidate_state_dict + save_state_dict on rank 0, and save_sharded)
Then for each run 1..RUNS, one launch after the other (each after --settle
seconds of sleep), in this order in odd
runs and the reverse in even ones (each load in fresh processes, so that its
peak RSS is its own; the files come from the page cache; a launch right after
one that freed much memory tends to fault faster on this VM):
  torch consolidated load (torch.load + load_state_dict),
  dopt consolidated load (load_state_dict(path)),
  with --baseline BENCH: the same with another build's bench binary,
  the same with DOPT_HUGEPAGES=0 (the loaded state in 4 KiB pages),
  dopt consolidated load through a whole StateDict (load_state_dict(dopt::load_state_dict(path))),
  dopt load_sharded,
  dopt async save: a training loop with a Checkpointer (parameters and
      shards), --reps synchronous saves, then --reps save_async calls with
      steps while each is written, then as many with background_snapshot
      (the stall: save_async's time plus the next step's wait_snapshot()).
Each JSON record is appended to --out with impl, run, the session and "load"
(the load average before and after, the foreign CPU fraction during the
launch, the wall time, the command: compare_zero_torch.py's launch()).

`summary`: a markdown table of the latest session: medians over runs, the
ratios and the issue's targets (consolidated load <= 1.0 x torch's time;
load_sharded's peak rise <= 1.1 x the shard; async stall <= 5% of a
synchronous save), with each run's value after the median; beside the
consolidated load's time, its CPU time (user + system of the busiest rank),
which the other work on a shared machine inflates far less than the time.
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from compare_zero_torch import launch  # noqa: E402

PY = "/usr/bin/python3"
MB = 1e6


def run(a):
    dopt_run, bench = (os.path.join(a.build, *p) for p in (("tools", "dopt-run"),
                                                            ("bench", "dopt_bench_checkpoint_load")))
    missing = [f for f in (dopt_run, bench) if not os.access(f, os.X_OK)]
    if missing:
        raise SystemExit(f"not built: {' '.join(missing)} (cmake --build {a.build} --target dopt-run "
                         "dopt_bench_checkpoint_load)")
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="dopt-ckpt-compare-", dir=a.tmp)
    ws, n = "2", str(a.numel)
    torch_cmd = lambda mode: [PY, os.path.join(HERE, "checkpoint_torch.py"), "--mode", mode, "--dir", tmp,  # noqa: E731
                              "--world-size", ws, "--numel", n]
    dopt_cmd = lambda *mode: [dopt_run, "--nproc-per-node", ws, "--master-port", "0", bench, "--dir", tmp,  # noqa: E731
                              "--params", n, "--mode", *mode]
    plan = [("torch", "consolidated", torch_cmd("load")),
            ("dopt", "consolidated", dopt_cmd("consolidated")),
            ("dopt", "consolidated_small_pages", ["env", "DOPT_HUGEPAGES=0"] + dopt_cmd("consolidated")),
            ("dopt", "consolidated_via_dict", dopt_cmd("consolidated", "--via-dict")),
            ("dopt", "sharded", dopt_cmd("sharded")),
            ("dopt", "async", dopt_cmd("async", "--reps", str(a.reps)))]
    if a.baseline:  # another build's bench (copied aside), right after this build's consolidated load
        plan.insert(2, ("dopt_baseline", "consolidated", [dopt_run, "--nproc-per-node", ws, "--master-port", "0",
                                                          a.baseline, "--dir", tmp, "--params", n,
                                                          "--mode", "consolidated"]))

    def record(impl, what, run_no, cmd):
        time.sleep(a.settle)
        recs, load = launch(cmd, a.quiet_wait)
        rec = recs[0]
        rec.update(impl=impl, what=what, run=run_no, session=started, load=load)
        with open(a.out, "a") as f:
            f.write(json.dumps(rec) + "\n")
        keys = ("load_ms", "load_cpu_ms", "peak_rise_bytes", "stall_over_sync", "sync_save_ms", "async_stall_ms", "bg_stall_ms",
                "bg_stall_over_sync")
        shown = ", ".join(f"{k} {rec[k]}" for k in keys if k in rec)
        print(f"run {run_no} {impl} {what}: {shown} (load avg {load['loadavg_before'][0]}-"
              f"{load['loadavg_after'][0]}, foreign {load['foreign_frac']})", flush=True)

    try:
        record("torch", "save", 0, torch_cmd("save"))
        record("dopt", "save", 0, dopt_cmd("save"))
        for r in range(1, a.runs + 1):
            for impl, what, cmd in (plan if r % 2 else plan[::-1]):
                record(impl, what, r, cmd)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def med(xs):
    return statistics.median(xs) if xs else None


def fmt(x, nd=1):
    return "-" if x is None else f"{x:.{nd}f}"


def summary(a):
    recs = [json.loads(l) for l in open(a.inp) if l.strip()]
    last = a.session or max(r.get("session", "") for r in recs)
    recs = [r for r in recs if r.get("session", "") == last]
    if not recs:
        raise SystemExit(f"{a.inp}: no session {last}")
    by = {}
    for r in recs:
        by.setdefault((r["impl"], r["what"]), []).append(r)
    get = lambda impl, what, key: med([r[key] for r in by.get((impl, what), []) if key in r])  # noqa: E731
    loads = [x for r in recs for x in (r["load"]["loadavg_before"][0], r["load"]["loadavg_after"][0])]
    foreign = [r["load"]["foreign_frac"] for r in recs]
    runs = len(by.get(("dopt", "sharded"), []))
    print(f"Session {last}: {len(recs)} launches ({runs} runs) on {recs[0]['load']['ncpu']} CPUs; 1-min load "
          f"average {min(loads):.2f}-{max(loads):.2f} (median {med(loads):.2f}); foreign CPU during a launch "
          f"median {med(foreign):.2f}, max {max(foreign):.2f}.\n")
    tl, dl, vl = (get("torch", "consolidated", "load_ms"), get("dopt", "consolidated", "load_ms"),
                  get("dopt", "consolidated_via_dict", "load_ms"))
    tp, dp, vp = (get("torch", "consolidated", "peak_rise_bytes"), get("dopt", "consolidated", "peak_rise_bytes"),
                  get("dopt", "consolidated_via_dict", "peak_rise_bytes"))
    # Per run: torch's and dopt's launches of one run are neighbours in time.
    per_run = {}
    for r in recs:
        if r["what"] == "consolidated":
            per_run.setdefault(r["run"], {})[r["impl"]] = r["load_ms"]
    ratios = ", ".join(f"{v['dopt'] / v['torch']:.2f}" for _, v in sorted(per_run.items()) if "dopt" in v and "torch" in v)
    print("| measure | torch 1.13 | dopt | dopt/torch | target |")
    print("|---|---|---|---|---|")
    print(f"| consolidated load, ms (slowest rank) | {fmt(tl)} | {fmt(dl)} | {fmt(dl / tl, 2)} (runs: {ratios}) "
          f"| <= 1.0 |")
    tc, dc = get("torch", "consolidated", "load_cpu_ms"), get("dopt", "consolidated", "load_cpu_ms")
    cpu_runs = {}
    for r in recs:
        if r["what"] == "consolidated" and "load_cpu_ms" in r:
            cpu_runs.setdefault(r["run"], {})[r["impl"]] = r["load_cpu_ms"]
    cpu_ratios = ", ".join(f"{v['dopt'] / v['torch']:.2f}" for _, v in sorted(cpu_runs.items())
                           if "dopt" in v and "torch" in v)
    if tc is not None and dc is not None:
        print(f"| consolidated load, CPU ms (user + system, largest rank) | {fmt(tc)} | {fmt(dc)} | "
              f"{fmt(dc / tc, 2)} (runs: {cpu_ratios}) | - |")
    print(f"| consolidated load, peak RSS rise MB/rank | {fmt(tp / MB)} | {fmt(dp / MB)} | {fmt(dp / tp, 2)} | - |")
    bl, bc = get("dopt_baseline", "consolidated", "load_ms"), get("dopt_baseline", "consolidated", "load_cpu_ms")
    if bl is not None:
        base_runs = {}
        for r in recs:
            if r["what"] == "consolidated":
                base_runs.setdefault(r["run"], {})[r["impl"]] = r["load_ms"]
        base_ratios = ", ".join(f"{v['dopt'] / v['dopt_baseline']:.2f}" for _, v in sorted(base_runs.items())
                                if "dopt" in v and "dopt_baseline" in v)
        print(f"| the same, --baseline build: ms / CPU ms (this build / baseline, runs: {base_ratios}) | {fmt(tl)} / "
              f"{fmt(tc)} | {fmt(bl)} / {fmt(bc)} | {fmt(bl / tl, 2)} / {fmt(bc / tc, 2)} | {fmt(dl / bl, 2)} |")
    ql, qc = get("dopt", "consolidated_small_pages", "load_ms"), get("dopt", "consolidated_small_pages", "load_cpu_ms")
    if ql is not None:
        print(f"| the same in 4 KiB pages (DOPT_HUGEPAGES=0), ms / CPU ms | {fmt(tl)} / {fmt(tc)} | {fmt(ql)} / "
              f"{fmt(qc)} | {fmt(ql / tl, 2)} / {fmt(qc / tc, 2)} | - |")
    print(f"| the same through load_state_dict(dopt::load_state_dict(path)), ms | {fmt(tl)} | {fmt(vl)} | "
          f"{fmt(vl / tl, 2)} | - |")
    print(f"| the same, peak RSS rise MB/rank | {fmt(tp / MB)} | {fmt(vp / MB)} | {fmt(vp / tp, 2)} | - |")
    sl = get("dopt", "sharded", "load_ms")
    sp, sf = get("dopt", "sharded", "peak_rise_bytes"), get("dopt", "sharded", "shard_file_bytes")
    print(f"| load_sharded, ms | - | {fmt(sl)} | - | - |")
    print(f"| load_sharded, peak RSS rise / shard file ({fmt(sp / MB)} / {fmt(sf / MB)} MB) | - | "
          f"{fmt(sp / sf, 3)} | - | <= 1.1 |")
    ss, sa = get("dopt", "async", "sync_save_ms"), get("dopt", "async", "async_stall_ms")
    st, sb = get("dopt", "async", "step_ms"), get("dopt", "async", "step_ms_while_writing")
    bs, bb = get("dopt", "async", "bg_stall_ms"), get("dopt", "async", "bg_step_ms_while_writing")
    each = lambda key: ", ".join(f"{r[key]:.3f}" for r in sorted(by.get(("dopt", "async"), []),  # noqa: E731
                                                                 key=lambda r: r["run"]) if key in r)
    print(f"| Checkpointer: save ms / save_async stall ms (snapshot on the caller / background_snapshot) | - | "
          f"{fmt(ss)} / {fmt(sa)} / {fmt(bs)} | - | - |")
    print(f"| save_async stall / save, snapshot on the caller | - | "
          f"{fmt(get('dopt', 'async', 'stall_over_sync'), 3)} (runs: {each('stall_over_sync')}) | - | - |")
    print(f"| save_async stall / save, background_snapshot | - | "
          f"{fmt(get('dopt', 'async', 'bg_stall_over_sync'), 4)} (runs: {each('bg_stall_over_sync')}) | - | <= 0.05 |")
    print(f"| step ms alone / while a save is written (caller / background) | - | {fmt(st)} / {fmt(sb)} / "
          f"{fmt(bb)} | - | - |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cmd", choices=["run", "summary"])
    results = os.path.join(HERE, "results", "checkpoint_compare.jsonl")
    for flag, kw in [("--runs", dict(type=int, default=int(os.environ.get("RUNS", "3")))),
                     ("--reps", dict(type=int, default=3, help="async: saves of each kind per run")),
                     ("--build", dict(default=os.environ.get("BUILD", os.path.join(ROOT, "build")))),
                     ("--numel", dict(type=int, default=50_000_000)),
                     ("--baseline", dict(default=None, help="run: another build's dopt_bench_checkpoint_load (copied "
                                                            "aside), whose consolidated load runs beside this one's")),
                     ("--tmp", dict(default=None, help="run: the temporary checkpoint folder's parent")),
                     ("--quiet-wait", dict(type=float, default=0.0,
                                           help="run: wait up to this many seconds for foreign CPU < 10%% "
                                                "before each launch")),
                     ("--settle", dict(type=float, default=4.0,
                                       help="run: seconds to sleep before each launch, so that the memory the "
                                            "last launch freed has been handed back to the host (free page "
                                            "reporting) and every launch faults its memory in from the same state")),
                     ("--out", dict(default=results, help="run: where the records are appended")),
                     ("--in", dict(dest="inp", default=results, help="summary: the records")),
                     ("--session", dict(default=None, help="summary: this session (default: the latest)"))]:
        ap.add_argument(flag, **kw)
    a = ap.parse_args()
    run(a) if a.cmd == "run" else summary(a)


if __name__ == "__main__":
    main()
