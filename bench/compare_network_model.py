#!/usr/bin/python3
"""The network model of deterministic simulation against real runs.

    sudo /usr/bin/python3 bench/compare_network_model.py BUILD_DIR [--out OUT.jsonl] [--rounds 2]
    /usr/bin/python3 bench/compare_network_model.py BUILD_DIR --repredict 2026-12-07T18:31Z   (a recorded run, again)

Every round, for every configuration in turn (interleaved; the load average
before each run recorded), so that parameters and figures share the load:
1. Measures the model's parameters, none of them from the figures it predicts:
   the host's memory and cache traffic (a reduce benchmark, read two write
   one: one 64 MiB, then one 1 MiB float32 addition per core at once), just
   before and just after each run on the shared-memory plane (their mean);
   the cache's effective size (the same kernel over working sets of 6 to 48
   MiB in all: where its rate falls halfway, in log, from the cache's to the
   memory's; sysfs gives the largest cache's size, which other tenants of a
   virtual machine share); a wake-up (dopt_bench_sim wake: a futex hand-over
   between two processes on two cores) and an exchange (dopt_bench_sim exchange: reading what another core
   has just written, the one-round all_reduce's pattern at 4-32 KiB) just before each shared-memory run;
   the synchronisation of a host's processes (an 8-byte all_reduce on the
   shared-memory plane), the link's rate (raw TCP, both hosts sending 16 MiB
   to each other at once, dopt_bench_raw_tcp) and latency (an 8-byte
   all_reduce between the two hosts: one exchange, the ring's latency path).
2. Predicts all_reduce at 4 KiB, 1 MiB and 64 MiB with the model
   (dopt_bench_sim predict: a deterministic simulate() with
   SimulateOptions::network).
3. Measures them (dopt_bench_collectives under dopt-run, in the run that
   timed the 8-byte call): the shared-memory plane with 2 and 4 processes,
   and two network-namespace "hosts" (one rank each, a veth pair on a
   bridge, the link limited with tc tbf to each rate, modelled as a shaped
   link: NetworkModel::link_shaped; the TCP plane as dopt sets it).
The medians over the rounds are compared.
4. Prints predicted / measured / ratio and appends every line (parameters,
   predictions, measurements, comparison) to OUT (default
   bench/results/network_model.jsonl).

Needs root (network namespaces, tc). Only namespaces it creates carry traffic;
they are removed at the end.
"""
import argparse
import datetime
import json
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from namespace_hosts import NamespaceHosts

SIZES = [4096, 1 << 20, 64 << 20]
# The shared-memory plane's waiters: they poll this long before they sleep (WaitPolicy, transport/shm/channel.hpp)
SPIN_US, SPIN_PAST_CORES_US = 20, 2
TAG = "dnm%d" % os.getpid()


def load():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def json_lines(text):
    return [json.loads(line) for line in text.splitlines() if line.strip().startswith("{")]


def run(cmd, timeout=900, env=None):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if p.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (" ".join(cmd), p.returncode, p.stderr[-2000:]))
    return p.stdout


# --- the parameters ------------------------------------------------------------------

def _traffic_worker(kernel, n, reps, go, q):
    import numpy
    a = numpy.random.default_rng(1).random(n // 4, dtype=numpy.float32)
    b = a.copy()
    out = numpy.empty_like(a)
    step = (lambda: numpy.add(a, b, out=out)) if kernel == "reduce" else (lambda: numpy.copyto(out, a))
    step()  # touch
    go.wait()
    secs = []
    for _ in range(reps):
        t0 = time.perf_counter()
        step()
        secs.append(time.perf_counter() - t0)
    q.put(statistics.median(secs))


def memory_traffic_gbs(cores, n=64 << 20, reps=8, tries=3, kernel="reduce"):
    """Bytes read + written per second by `cores` processes at once, each running `kernel` over float32
    arrays of n bytes: reduce adds two into a third (reads two, writes one: the plane's reduce, which
    reads n inputs and writes its outputs), copy copies one into another. Each process's median time of
    one pass (the figures it is compared with are medians of calls: a pass that another user's process
    preempted counts no more than such a call), the slowest process's; best of tries."""
    best = 0.0
    for _ in range(tries):
        go = multiprocessing.Event()
        q = multiprocessing.Queue()
        ps = [multiprocessing.Process(target=_traffic_worker, args=(kernel, n, reps, go, q)) for _ in range(cores)]
        for p in ps:
            p.start()
        time.sleep(1.0)
        go.set()
        secs = [q.get(timeout=120) for _ in ps]
        for p in ps:
            p.join()
        best = max(best, (3.0 if kernel == "reduce" else 2.0) * n * cores / max(secs) / 1e9)
    return best


def effective_cache_bytes(cores, cache_gbs, memory_gbs, sizes_mib=(6, 12, 24, 48)):
    """The total working set (bytes) at which the reduce kernel's rate, run by `cores` processes at once, falls
    to the geometric mean of the cache's and the memory's rates (log-interpolated between the measured sizes);
    the largest size measured when it never falls that far, the smallest when it is already below."""
    import math
    target = math.sqrt(cache_gbs * memory_gbs)
    pts = []
    for mib in sizes_mib:
        n = (mib << 20) // (3 * cores)
        n -= n % 4096
        pts.append((mib << 20, memory_traffic_gbs(cores, n=n, reps=max(8, (256 << 20) // n), tries=1)))
    if pts[0][1] < target:
        return pts[0][0], pts
    for (w0, r0), (w1, r1) in zip(pts, pts[1:]):
        if r1 < target <= r0:
            f = math.log(r0 / target) / math.log(r0 / r1)
            return int(w0 * (w1 / w0) ** f), pts
    return pts[-1][0], pts


def wake_us(build):
    """A futex wake-up on another core (dopt_bench_sim wake), us."""
    return json_lines(run([build + "/bench/dopt_bench_sim", "wake"]))[0]["wake_us"]


def exchange_gbs(build):
    """Reading what another core just wrote (dopt_bench_sim exchange), GB/s a core."""
    return json_lines(run([build + "/bench/dopt_bench_sim", "exchange"]))[-1]["exchange_gbs"]


def cache_bytes(shared=True):
    """The largest cache's size (sysfs), 0 when unknown; shared=False: the largest one a core has to itself
    (shared_cpu_list names one CPU)."""
    best = 0
    base = "/sys/devices/system/cpu/cpu0/cache"
    for d in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        try:
            with open(os.path.join(base, d, "size")) as f:
                t = f.read().strip()
            with open(os.path.join(base, d, "shared_cpu_list")) as f:
                cpus = f.read().strip()
        except OSError:
            continue
        if not shared and ("," in cpus or "-" in cpus):
            continue
        mult = {"K": 1 << 10, "M": 1 << 20}.get(t[-1:], 1)
        best = max(best, int(t.rstrip("KM")) * mult)
    return best


def shm_collective(build, nproc, sizes, iters=None):
    cmd = [build + "/tools/dopt-run", "--nproc-per-node", str(nproc), "--master-port", "0", "--no-prefix",
           build + "/bench/dopt_bench_collectives", "--op", "all_reduce", "--bytes"] + [str(s) for s in sizes]
    if iters:
        cmd += ["--iters", str(iters)]
    return json_lines(run(cmd))


class Hosts(NamespaceHosts):
    """Two network namespaces joined by veth pairs on a bridge (as bench/compare_multihost.sh)."""

    def __init__(self, workdir):
        super().__init__(TAG)
        self.work = workdir
        self.port = 29700
        secret = os.path.join(workdir, "secret")
        os.mkdir(secret, 0o700)
        with open(os.path.join(secret, "s"), "w") as f:
            f.write(os.urandom(32).hex())
        os.chmod(os.path.join(secret, "s"), 0o600)
        # The ranks' TCP plane as dopt sets it for one rank on a host of two cores (TcpMesh::default_poll_us: it
        # polls 200 us after every event). Runs before 2026-12-07T21:25Z set DOPT_TCP_POLL_US=0 (an earlier
        # plane's polling took the core the other host's rank needed); a 4 KiB call then paid a wake-up per burst
        # of segments, 64-228 us between rounds, against 32-57 us polling (the 8-byte call: 28-84 and 26-50 us).
        self.env = dict(os.environ, DOPT_JOB_ID="netmodel-%d" % os.getpid(), DOPT_SECRET_FILE=secret + "/s")
        self.env.pop("DOPT_TCP_POLL_US", None)

    def cmd(self, i, argv):
        """argv in host i: its own network, hostname and /dev/shm."""
        return self.in_host(i, argv, "2g")

    def both(self, argvs, timeout=900):
        ps = [subprocess.Popen(self.cmd(i, argvs[i]), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=self.env) for i in (0, 1)]
        outs = []
        try:
            for p in ps:
                out, err = p.communicate(timeout=timeout)
                if p.returncode != 0:
                    raise RuntimeError("host command failed (%d): %s" % (p.returncode, err[-2000:]))
                outs.append(out)
        finally:
            for p in ps:
                if p.poll() is None:
                    p.kill()
        return outs

    def collective(self, build, sizes, iters=None):
        self.port += 1
        argvs = []
        for i in (0, 1):
            a = [build + "/tools/dopt-run", "--nproc-per-node", "1", "--nnodes", "2", "--node-rank", str(i),
                 "--master-addr", "10.232.0.1", "--master-port", str(self.port), "--no-prefix",
                 build + "/bench/dopt_bench_collectives", "--op", "all_reduce", "--bytes"] + [str(s) for s in sizes]
            if iters:
                a += ["--iters", str(iters)]
            argvs.append(a)
        return json_lines(self.both(argvs)[0])

    def raw_tcp_gbits(self, build, nbytes=16 << 20):
        self.port += 1
        srv = subprocess.Popen(self.cmd(0, [build + "/bench/dopt_bench_raw_tcp", "server", str(self.port), "1",
                                            str(nbytes)]), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(0.5)
        run(self.cmd(1, [build + "/bench/dopt_bench_raw_tcp", "client", "10.232.0.1", str(self.port), "1",
                         str(nbytes)]))
        out, _ = srv.communicate(timeout=300)
        return max(r["gbs_per_direction"] for r in json_lines(out)) * 8


def predict(build, hosts, per_host, p):
    cmd = [build + "/bench/dopt_bench_sim", "predict", "--hosts", str(hosts), "--per-host", str(per_host),
           "--link-gbits", str(p["link_gbits"]), "--link-latency-us", str(p["link_latency_us"]),
           "--memory-gbs", str(p["memory_gbs"]), "--cache-gbs", str(p["cache_gbs"]),
           "--cache-bytes", str(p["cache_bytes"]), "--cores", str(p["cores"]), "--sync-us", str(p["sync_us"]),
           "--wake-us", str(p["wake_us"]), "--spin-us", str(SPIN_US), "--spin-past-cores-us", str(SPIN_PAST_CORES_US),
           "--exchange-gbs", str(p["exchange_gbs"]), "--core-cache-bytes", str(p["core_cache_bytes"]), "--bytes"] + [str(s) for s in SIZES]
    if p.get("link_shaped"):
        cmd.append("--link-shaped")
    return {r["bytes"]: r for r in json_lines(run(cmd))}


def table(preds, meas, loads):
    """Prints the comparison table (medians of the rounds) of {config: {bytes: [per round]}} predictions and
    measurements; returns its rows as dicts (layout, bytes, predicted_us, measured_us, its range, ratio, loads)."""
    print("\n| layout | size | predicted | measured | its rounds | ratio | load |")
    print("|---|---|---|---|---|---|---|")
    rows = []
    for c in preds:
        plane, n, rate = c
        layout = "shm, %d processes" % n if rate is None else "2 hosts x 1, tbf %s" % rate
        for b in SIZES:
            pr, me = statistics.median(preds[c][b]), statistics.median(meas[c][b])
            lo, hi = min(meas[c][b]), max(meas[c][b])
            ld = "/".join(x.split()[0] for x in loads[c])
            print("| %s | %s | %s | %s | %s-%s | %.2f | %s |" % (layout, size_str(b), us_str(pr), us_str(me),
                                                               us_str(lo), us_str(hi), pr / me, ld))
            rows.append(dict(layout=layout, bytes=b, predicted_us=pr, measured_us=me, measured_min_us=lo,
                             measured_max_us=hi, ratio=pr / me, loads=ld))
    return rows


def repredict(build, path, date):
    """The table of a recorded run, its predictions made again from its recorded parameters."""
    with open(path) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    recs = [r for r in recs if r.get("date") == date]
    params = [r for r in recs if r["kind"] == "parameter" and r.get("name") == "latency"]
    if not params:
        sys.exit("compare_network_model: no run of %s in %s" % (date, path))
    meas = {}
    for r in recs:
        if r["kind"] == "measurement":
            meas[(r["plane"], r["procs"], r["rate"], r["round"], r["bytes"])] = r["median_us"]
    preds, measured, loads = {}, {}, {}
    for p in params:
        c = (p["plane"], p["procs"], p["rate"])
        q = dict(p)
        q.setdefault("exchange_gbs", 0)
        q.setdefault("core_cache_bytes", cache_bytes(shared=False))  # recorded before it was: this machine's
        if p["rate"]:
            q["link_latency_us"] = p["tiny_us"]  # recorded as half of it before the model took the latency path
        pr = predict(build, 1 if p["rate"] is None else 2, p["procs"] if p["rate"] is None else 1, q)
        for b in SIZES:
            preds.setdefault(c, {}).setdefault(b, []).append(pr[b]["predicted_us"])
            measured.setdefault(c, {}).setdefault(b, []).append(meas[c + (p["round"], b)])
        loads.setdefault(c, []).append(p["load"])
    table(preds, measured, loads)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                  "network_model.jsonl"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--procs", default="2,4", help="process counts on the shared-memory plane")
    ap.add_argument("--rates", default="1gbit,4gbit", help="tc tbf rates of the two hosts' links")
    ap.add_argument("--repredict", metavar="DATE",
                    help="measure nothing: predict the run of DATE (its \"date\" field) recorded in --out again with "
                    "this build's model and its recorded parameters (one recorded before core_cache_bytes was: this machine's), "
                    "and print its table (no root needed)")
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    if args.repredict:
        return repredict(build, args.out, args.repredict)
    if os.geteuid() != 0:
        sys.exit("compare_network_model: needs root (network namespaces, tc)")
    procs = [int(x) for x in args.procs.split(",") if x]
    rates = [x for x in args.rates.split(",") if x]
    date = datetime.datetime.utcnow().strftime("%Y-%m-%dT%H:%MZ")
    cmdline = " ".join(["bench/compare_network_model.py"] + sys.argv[1:])
    records = []

    def emit(r):
        r.update(date=date, command=cmdline)
        records.append(r)
        print(json.dumps(r), flush=True)

    cores = os.cpu_count() or 1
    work = tempfile.mkdtemp(prefix="dopt-netmodel.")
    hosts = None
    try:
        hosts = Hosts(work)
        configs = [("shm", n, None) for n in procs] + [("2 hosts", 1, rate) for rate in rates]
        preds = {c: {b: [] for b in SIZES} for c in configs}
        meas = {c: {b: [] for b in SIZES} for c in configs}
        loads = {c: [] for c in configs}
        cbytes, core_cache = cache_bytes(), cache_bytes(shared=False)
        def host_traffic(rnd, **where):
            """The memory and cache traffic parameters (reduce kernel), with the load, emitted."""
            mem = memory_traffic_gbs(cores, tries=1)
            cache = memory_traffic_gbs(cores, n=1 << 20, reps=256, tries=1)
            emit(dict(kind="parameter", name="memory", round=rnd + 1, memory_gbs=round(mem, 3),
                      cache_gbs=round(cache, 3), cache_bytes=cbytes, cores=cores, load=load(), **where,
                      how="%d processes adding two float32 arrays of 64 MiB (memory), then 1 MiB (cache) into a third "
                      "each at once, read + written bytes per second; cache_bytes: the largest cache (sysfs)" % cores))
            return mem, cache

        for rnd in range(args.rounds):
            # 1. a copy's traffic, for comparison only (the model takes the reduce kernel's)
            copy = [memory_traffic_gbs(cores, tries=1, kernel="copy"),
                    memory_traffic_gbs(cores, n=1 << 20, reps=256, tries=1, kernel="copy")]
            emit(dict(kind="parameter", name="copy", round=rnd + 1, copy_memory_gbs=round(copy[0], 3),
                      copy_cache_gbs=round(copy[1], 3), load=load(),
                      how="as memory_gbs and cache_gbs with a copy (numpy.copyto), not used by the model"))
            mem, cache = 0.0, 0.0
            # the cache's effective size, once a round
            m0, c0 = host_traffic(rnd, when="for the cache's size")
            cbytes, pts = effective_cache_bytes(cores, c0, m0)
            emit(dict(kind="parameter", name="cache_bytes", round=rnd + 1, cache_bytes=cbytes, load=load(),
                      rates_gbs={str(w >> 20) + " MiB": round(r, 2) for w, r in pts}, sysfs_bytes=cache_bytes(),
                      how="the reduce kernel on %d processes over working sets in all of these sizes; where its "
                      "rate falls to the geometric mean of the cache's (%.1f) and the memory's (%.1f) GB/s" %
                      (cores, c0, m0)))
            for c in configs:
                plane, n, rate = c
                # 1. the host's traffic just before and just after the run (their means), so that the
                # parameters share the run's load
                if rate is None:
                    mem, cache = host_traffic(rnd, plane=plane, procs=n, when="before")
                before = load()
                # 3. the measurement, and first in the same run (just before the 4 KiB call, whose time depends
                # most on it) the 8-byte call that gives the latency parameter
                wake, xgbs = 0.0, 0.0
                if rate is None:
                    wake = wake_us(build)
                    xgbs = exchange_gbs(build)  # last before the run: its rate changes with the machine's state
                    rs = shm_collective(build, n, [8] + SIZES)
                    gbits = 10
                    after = host_traffic(rnd, plane=plane, procs=n, when="after")
                    mem, cache = (mem + after[0]) / 2, (cache + after[1]) / 2
                else:
                    hosts.rate(rate)
                    gbits = hosts.raw_tcp_gbits(build)
                    rs = hosts.collective(build, [8] + SIZES)
                loads[c].append(before)
                by = {r["bytes"]: r for r in rs}
                tiny = by[8]["median_us"]
                p = dict(memory_gbs=round(mem, 3), cache_gbs=round(cache, 3), cache_bytes=cbytes, cores=cores,
                         sync_us=tiny if rate is None else 0, wake_us=wake, exchange_gbs=round(xgbs, 3),
                         core_cache_bytes=core_cache, link_gbits=round(gbits, 4),
                         link_latency_us=round(tiny, 2) if rate else 0, link_shaped=bool(rate))
                emit(dict(kind="parameter", name="latency", plane=plane, procs=n if rate is None else 2, rate=rate,
                          round=rnd + 1, tiny_us=tiny, load=before, **p,
                          how="sync_us: an 8-byte all_reduce on one host; wake_us: a futex hand-over between two "
                          "cores just before it (dopt_bench_sim wake); exchange_gbs: reading what another core has "
                          "just written, just before (dopt_bench_sim exchange); core_cache_bytes: the largest cache a "
                          "core has to itself (sysfs); link_shaped: the link is tc tbf's token bucket; "
                          "link_latency_us: one across the "
                          "hosts (one exchange: the ring's latency path); link_gbits: raw TCP both ways at once, 16 MiB, one stream"))
                # 2. the prediction with this round's parameters
                pr = predict(build, 1 if rate is None else 2, n, p)
                for b in SIZES:
                    preds[c][b].append(pr[b]["predicted_us"])
                    meas[c][b].append(by[b]["median_us"])
                    emit(dict(kind="prediction", plane=plane, procs=n if rate is None else 2, rate=rate,
                              round=rnd + 1, **pr[b]))
                    emit(dict(kind="measurement", plane=plane, procs=n if rate is None else 2, rate=rate,
                              round=rnd + 1, loadavg_before=before, **by[b]))
        # 4. the table
        for r in table(preds, meas, loads):
            emit(dict(kind="comparison", **dict(r, ratio=round(r["ratio"], 3)), within_25=abs(r["ratio"] - 1) <= 0.25))
    finally:
        if hosts:
            hosts.close()
        shutil.rmtree(work, ignore_errors=True)
        if records:
            os.makedirs(os.path.dirname(args.out), exist_ok=True)
            with open(args.out, "a") as f:
                for r in records:
                    f.write(json.dumps(r) + "\n")
            print("compare_network_model: appended %d lines to %s" % (len(records), args.out), file=sys.stderr)


def size_str(b):
    return "%d KiB" % (b >> 10) if b < (1 << 20) else "%d MiB" % (b >> 20)


def us_str(us):
    return "%.0f us" % us if us < 1000 else "%.1f ms" % (us / 1000)


if __name__ == "__main__":
    main()
