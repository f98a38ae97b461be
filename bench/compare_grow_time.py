#!/usr/bin/env python3
"""Issue 45's time target, measured: a replacement's time from its process
start to the end of its first training step against 1.5 x (the state bytes
it receives / the plane's copy rate measured in the same run) + 1 s, and the
other ranks' slowest step around the join against their median step.

    /usr/bin/python3 bench/compare_grow_time.py [--build build] [--plane tcp]
        [--variants loopback,twohost] [--runs 3] [--params 50000000]
        [--tensors 100] [--nproc 4] [--steps 10] [--kill-at 3]
        [--compute-ms 200] [--rate RATE] [--out FILE]

Each run is one job of dopt_bench_grow (bench/grow_bench.cpp) under
dopt-run --on-failure replace --max-replacements 1:

  loopback  one dopt-run, --nproc ranks on this host;
  twohost   two network namespaces joined by veth pairs on a bridge (as
            bench/compare_multihost.sh makes them; each host its own UTS,
            IPC and mount namespace with its own /dev/shm), --nproc/2 ranks
            on each, one dopt-run per host (--nnodes 2); the victim, the last
            rank, is on host 1, so its parameters cross the link. --rate
            limits each host's link with tc tbf (each way, e.g. 4gbit); the
            default is the unlimited veth. Needs root.

--plane: tcp (DOPT_TRANSPORT=tcp, the actor plane; across hosts with
DOPT_BIND_ADDR=0.0.0.0) or shm (DOPT_TRANSPORT unset: shm on one host, the
hierarchical plane across two) once a plane other than the actor plane takes
a replacement. Every run records /proc/loadavg before and after; results go
to bench/results/grow_time_<UTC date>.jsonl (one line per run) and a markdown
table is printed. Exits 1 when a run failed: dopt-run's exit status, no first
step of the replacement, or a rank that did not finish in the grown group."""
import argparse
import datetime
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile

from namespace_hosts import NamespaceHosts

HERE = pathlib.Path(__file__).resolve().parent


def loadavg():
    return " ".join(pathlib.Path("/proc/loadavg").read_text().split()[:3])


def parse_lines(text):
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return out


def bench_args(a):
    return ["--params", str(a.params), "--tensors", str(a.tensors), "--steps", str(a.steps), "--kill-at",
            str(a.kill_at), "--compute-ms", str(a.compute_ms)]


def plane_env(a, across_hosts):
    env = dict(os.environ)
    env.pop("DOPT_TRANSPORT", None)
    if a.plane == "tcp":
        env["DOPT_TRANSPORT"] = "tcp"
        if across_hosts:
            env["DOPT_BIND_ADDR"] = "0.0.0.0"
    return env


def run_loopback(a, work):
    cmd = [str(a.build / "tools/dopt-run"), "--nproc-per-node", str(a.nproc), "--on-failure", "replace",
           "--max-replacements", "1", "--no-prefix", str(a.build / "bench/dopt_bench_grow")] + bench_args(a)
    p = subprocess.run(cmd, env=plane_env(a, False), capture_output=True, text=True, timeout=a.timeout)
    return p.returncode, p.stdout, p.stderr


class Hosts(NamespaceHosts):
    """Two network namespaces h0, h1 (10.232.0.1, .2) on a bridge in a third; removed on exit."""

    def __init__(self, rate):
        super().__init__(f"dgt{os.getpid()}")
        if rate:
            self.rate(rate)

    def command(self, i, argv):
        """argv run in host i: its namespace, hostname host<i>, a /dev/shm of its own."""
        return self.in_host(i, argv, "4g")


def run_twohost(a, work, hosts, port):
    secret_dir = tempfile.mkdtemp(dir=work)
    os.chmod(secret_dir, 0o700)
    secret = pathlib.Path(secret_dir) / "s"
    secret.write_text(os.urandom(32).hex())
    os.chmod(secret, 0o600)
    env = plane_env(a, True)
    env.update(DOPT_JOB_ID=f"grow-time-{os.getpid()}-{port}", DOPT_SECRET_FILE=str(secret))
    per = a.nproc // 2
    procs = []
    for i in (0, 1):
        argv = [str(a.build / "tools/dopt-run"), "--nproc-per-node", str(per), "--nnodes", "2", "--node-rank", str(i),
                "--master-addr", "10.232.0.1", "--master-port", str(port), "--on-failure", "replace",
                "--max-replacements", "1", "--no-prefix", str(a.build / "bench/dopt_bench_grow")] + bench_args(a)
        procs.append(subprocess.Popen(hosts.command(i, argv), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    outs = [p.communicate(timeout=a.timeout) for p in procs]
    rc = max(p.returncode for p in procs)
    return rc, outs[0][0] + outs[1][0], outs[0][1] + outs[1][1]


def summarize(lines, nproc):
    """The run's figures from the ranks' JSON lines (None where a line is missing)."""
    copy = next((x for x in lines if x["kind"] == "copy"), None)
    join = next((x for x in lines if x["kind"] == "join"), None)
    kill = next((x for x in lines if x["kind"] == "kill"), None)
    steps = [x for x in lines if x["kind"] == "step"]
    r = {"copy_rate_bytes_per_s": copy and copy["rate_bytes_per_s"], "copy_bytes": copy and copy["bytes"]}
    if join:
        r.update(bytes_received=join["bytes_received"], join_step=join["step"],
                 newcomer_s=join["first_step_end"] - join["proc_start"],
                 newcomer_from_main_s=join["first_step_end"] - join["main_start"],
                 newcomer_init_s=join["init_done"] - join["main_start"],
                 newcomer_alloc_s=join["allocated"] - join["init_done"],
                 newcomer_wait_s=join["joined"] - join["allocated"],
                 newcomer_ready_s=join["allocated"] - join["proc_start"],
                 newcomer_catch_up_s=join["caught_up"] - join["joined"],
                 newcomer_first_step_s=join["first_step_end"] - join["caught_up"],
                 exec_to_main_s=join["main_start"] - join["proc_start"])
        if kill:
            r["kill_to_first_step_s"] = join["first_step_end"] - kill["time"]
            r["kill_to_proc_start_s"] = join["proc_start"] - kill["time"]
    if copy and join:
        r["bound_s"] = 1.5 * join["bytes_received"] / copy["rate_bytes_per_s"] + 1.0
        r["ratio_to_bound"] = r["newcomer_s"] / r["bound_s"]
        # What the join itself costs the newcomer: its start-up and the catch-up, without the wait for
        # the members' step boundary and without its first step's own length.
        r["newcomer_join_cost_s"] = r["newcomer_ready_s"] + r["newcomer_catch_up_s"]
    # The members: ranks that ran from the start and were not killed.
    victim = kill["rank"] if kill else nproc - 1
    members = [x for x in steps if x["incarnation"] == 0 and x["rank"] != victim]
    kill_at = kill["step"] if kill else None
    # Median step before the loss (step 0 creates the state: left out), per rank, then the largest.
    base = []
    for rk in sorted({x["rank"] for x in members}):
        mine = [x["end"] - x["start"] for x in members if x["rank"] == rk and x["step"] >= 1 and
                (kill_at is None or x["step"] < kill_at)]
        if mine:
            base.append(statistics.median(mine))
    grow_steps = [x for x in members if x["grew"]]
    rec_steps = [x for x in members if x["recovered"]]
    if base:
        r["member_median_step_s"] = max(base)
    if grow_steps:
        slowest = max(x["end"] - x["start"] for x in grow_steps)
        r["member_join_step_s"] = slowest
        r["member_grow_s"] = max(x["grow_s"] for x in grow_steps)
        r["member_catch_up_s"] = max(x["catch_up_s"] for x in grow_steps)
        r["catch_up_bytes_total"] = grow_steps[0].get("catch_up_bytes_total")
        r["catch_up_bytes_max_into_one"] = grow_steps[0].get("catch_up_bytes_max_into_one")
        if base:
            r["member_lost_s"] = slowest - max(base)
            r["member_lost_in_steps"] = r["member_lost_s"] / max(base)
    if rec_steps:
        r["member_recovery_step_s"] = max(x["end"] - x["start"] for x in rec_steps)
    after = [x["end"] - x["start"] for x in members if grow_steps and x["step"] > grow_steps[0]["step"]]
    if after:
        r["member_median_step_after_s"] = statistics.median(after)
    r["done_ranks"] = sorted({x["rank"] for x in lines if x["kind"] == "done"})
    return r


def table(rows):
    head = ("| variant | run | load before | bytes received | copy rate GB/s | bound s | newcomer s | /bound | "
            "start-up s | wait s | catch-up s | first step s | members' median step s | join step s | lost (steps) |")
    out = [head, "|" + "|".join(["---"] * (head.count("|") - 1)) + "|"]

    def f(v, fmt):
        return fmt.format(v) if isinstance(v, (int, float)) else "-"

    for x in rows:
        out.append("| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |".format(
            x["variant"], x["run"], x["loadavg_before"], f(x.get("bytes_received"), "{:,}"),
            f(x.get("copy_rate_bytes_per_s") and x["copy_rate_bytes_per_s"] / 1e9, "{:.2f}"),
            f(x.get("bound_s"), "{:.2f}"), f(x.get("newcomer_s"), "{:.2f}"), f(x.get("ratio_to_bound"), "{:.2f}"),
            f(x.get("newcomer_ready_s"), "{:.2f}"), f(x.get("newcomer_wait_s"), "{:.2f}"),
            f(x.get("newcomer_catch_up_s"), "{:.2f}"), f(x.get("newcomer_first_step_s"), "{:.2f}"),
            f(x.get("member_median_step_s"), "{:.3f}"), f(x.get("member_join_step_s"), "{:.3f}"),
            f(x.get("member_lost_in_steps"), "{:.2f}")))
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=str(HERE.parent / "build"))
    ap.add_argument("--plane", choices=["tcp", "shm"], default="tcp")
    ap.add_argument("--variants", default="loopback,twohost")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--params", type=int, default=50_000_000)
    ap.add_argument("--tensors", type=int, default=100)
    ap.add_argument("--nproc", type=int, default=4, help="ranks in all (an even number for twohost)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--kill-at", type=int, default=3)
    ap.add_argument("--compute-ms", type=int, default=200)
    ap.add_argument("--rate", default="", help="tc tbf rate of each host's link (twohost), e.g. 4gbit")
    ap.add_argument("--timeout", type=int, default=600, help="seconds a run may take")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    a.build = pathlib.Path(a.build).resolve()
    date = datetime.datetime.utcnow().strftime("%Y-%m-%d")
    out = pathlib.Path(a.out) if a.out else HERE / "results" / f"grow_time_{date}.jsonl"
    variants = [v for v in a.variants.split(",") if v]
    if "twohost" in variants and (os.geteuid() != 0 or a.nproc % 2):
        sys.exit("compare_grow_time: twohost needs root and an even --nproc")
    try:
        commit = subprocess.run(["git", "-C", str(HERE), "describe", "--always", "--dirty"], capture_output=True,
                                text=True).stdout.strip()
    except OSError:  # no git
        commit = ""
    work = tempfile.mkdtemp(prefix="dopt-growtime.")
    hosts = None
    rows = []
    port = 29700 + os.getpid() % 200
    try:
        if "twohost" in variants:
            hosts = Hosts(a.rate)
        # Interleaved: one run of each variant, then the next round.
        for run in range(a.runs):
            for v in variants:
                before = loadavg()
                if v == "loopback":
                    rc, so, se = run_loopback(a, work)
                else:
                    port += 1
                    rc, so, se = run_twohost(a, work, hosts, port)
                row = {"variant": v, "plane": a.plane, "run": run, "rc": rc, "loadavg_before": before,
                       "loadavg_after": loadavg(), "params": a.params, "tensors": a.tensors, "nproc": a.nproc,
                       "steps": a.steps, "kill_at": a.kill_at, "compute_ms": a.compute_ms,
                       "rate": a.rate if v == "twohost" else "", "date": date, "commit": commit,
                       "utc": datetime.datetime.utcnow().strftime("%H:%M:%S")}
                row.update(summarize(parse_lines(so), a.nproc))
                row["ok"] = rc == 0 and "newcomer_s" in row and row["done_ranks"] == list(range(a.nproc))
                if not row["ok"]:
                    row["stderr_tail"] = se[-2000:]
                    print(f"compare_grow_time: {v} run {run}: exit {rc}\n{se[-2000:]}", file=sys.stderr)
                rows.append(row)
                out.parent.mkdir(parents=True, exist_ok=True)
                with out.open("a") as fh:
                    fh.write(json.dumps(row) + "\n")
                print(f"compare_grow_time: {v} run {run}: newcomer {row.get('newcomer_s')} s, bound "
                      f"{row.get('bound_s')} s, load {before}", file=sys.stderr)
    finally:
        if hosts:
            hosts.close()
        shutil.rmtree(work, ignore_errors=True)
    print(table(rows))
    print(f"\n(plane {a.plane}; {a.params:,} float32 parameters in {a.tensors} tensors, Adam, ZeRO redundancy 1, "
          f"{a.nproc} ranks, {a.compute_ms} ms compute per step; twohost link: {a.rate or 'unlimited veth'}; "
          f"results in {out})")
    failed = [f"{x['variant']} run {x['run']}" for x in rows if not x["ok"]]
    if failed:
        sys.exit("compare_grow_time: failed (exit status, no first step of the replacement, or not every rank "
                 "done in the grown group): " + ", ".join(failed))


if __name__ == "__main__":
    main()
