#!/usr/bin/env python3
"""Runs dopt-example-trainer the ways a user would and compares the digests of
the final parameters (--print-digest: XXH3-64 of their bytes).

  check_trainer.py TRAINER DOPT_RUN plain
      3 simulated ranks; then the same folder again: nothing left to do, the
      same digest.
  check_trainer.py TRAINER DOPT_RUN world N
      at N ranks, bit for bit: N processes under dopt-run = N simulated ranks
      in one process = stopped at step k (--stop-at, processes) and resumed
      (simulated ranks) = stopped and resumed again (processes).
  check_trainer.py TRAINER DOPT_RUN ctrl-c
      SIGINT to one rank of a 3-process run: every rank stops after the same
      step s, a final checkpoint of step s is written and dopt-run exits 0.
      Resumed at 2 processes, the run ends bit for bit where --stop-at s at 3
      simulated ranks resumed at 2 simulated ranks ends, and its loss is the
      uninterrupted 3-rank run's within float rounding.

Why not one digest for every world size: average_gradients divides each
rank's gradient by the world size and sums the ranks' results (torch DDP's
arithmetic), and each rank's gradient is a mean over its share of the batch;
in float the sums are grouped differently at 1, 2 and 3 ranks (and x/3 is
rounded), so the parameters differ in their last bits from one world size to
the next. docs/trainer.md says what is bitwise and what is not.

Exit status 0 when every comparison holds, 1 otherwise (with the outputs).
"""
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

COMMON = ["--seed", "7", "--every", "5", "--keep-last", "2", "--print-digest"]
STEPS = 30


def fail(msg, *outputs):
    print("check_trainer: " + msg, file=sys.stderr)
    for out in outputs:
        print("---\n" + out, file=sys.stderr)
    sys.exit(1)


class Runner:
    def __init__(self, trainer, dopt_run, tmp):
        self.trainer, self.dopt_run, self.tmp = trainer, dopt_run, tmp
        self.folders = 0

    def folder(self):
        self.folders += 1
        return os.path.join(self.tmp, "ckpt%d" % self.folders)

    def command(self, how, ranks, ckpt, *args):
        argv = [self.trainer, "--checkpoint-dir", ckpt] + COMMON + list(args)
        if how == "processes":
            return [self.dopt_run, "--nproc-per-node", str(ranks), "--master-port", "0"] + argv
        return argv + ["--simulated-ranks", str(ranks)]

    def run(self, how, ranks, ckpt, *args):
        """The run's digest and output; fails unless it exits 0."""
        cmd = self.command(how, ranks, ckpt, *args)
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
        label = "%s at %d rank(s): %s" % (how, ranks, " ".join(cmd))
        if p.returncode != 0:
            fail("exit status %d from %s" % (p.returncode, label), p.stdout)
        return digest_of(p.stdout, label), p.stdout


def digest_of(out, label):
    found = re.findall(r"^(?:\[rank 0\] )?digest ([0-9a-f]{16})$", out, re.M)
    if len(found) != 1:
        fail("no single digest line from " + label, out)
    return found[0]


def last_loss(out):
    losses = re.findall(r"step \d+: loss (\S+)", out)
    return float(losses[-1])


def same(what, a, b, *outputs):
    if a != b:
        fail("%s: %s != %s" % (what, a, b), *outputs)
    print("ok: %s (%s)" % (what, a))


def plain(r):
    ckpt = r.folder()
    d1, out1 = r.run("simulated", 3, ckpt, "--steps", str(STEPS))
    d2, out2 = r.run("simulated", 3, ckpt, "--steps", str(STEPS))
    if "resumed at step %d" % STEPS not in out2:
        fail("the second run did not resume at step %d" % STEPS, out2)
    same("a finished run run again changes nothing", d1, d2, out1, out2)


def world(r, n):
    k = 12  # not a multiple of --every: the stop writes a checkpoint of its own
    d_proc, o1 = r.run("processes", n, r.folder(), "--steps", str(STEPS))
    d_sim, o2 = r.run("simulated", n, r.folder(), "--steps", str(STEPS))
    same("%d process(es) = %d simulated rank(s)" % (n, n), d_proc, d_sim, o1, o2)
    ckpt = r.folder()
    _, o3 = r.run("processes", n, ckpt, "--steps", str(STEPS), "--stop-at", str(k))
    if "stopped after step %d" % k not in o3:
        fail("--stop-at %d did not stop after step %d" % (k, k), o3)
    _, o4 = r.run("simulated", n, ckpt, "--steps", str(STEPS), "--stop-at", str(k + 9))
    d_resumed, o5 = r.run("processes", n, ckpt, "--steps", str(STEPS))
    same("%d rank(s): stopped at %d and %d and resumed = uninterrupted" % (n, k, k + 9), d_resumed, d_sim,
         o3, o4, o5)


def rank_pids(launcher_pid):
    """RANK -> pid of the processes dopt-run started."""
    pids = {}
    try:
        with open("/proc/%d/task/%d/children" % (launcher_pid, launcher_pid)) as f:
            children = [int(c) for c in f.read().split()]
    except OSError:
        return pids
    for c in children:
        try:
            with open("/proc/%d/environ" % c, "rb") as f:
                env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
        except OSError:
            continue
        if b"RANK" in env:
            pids[int(env[b"RANK"])] = c
    return pids


def ctrl_c(r):
    ckpt = r.folder()
    cmd = r.command("processes", 3, ckpt, "--steps", "1000000", "--log-every", "1")
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in p.stdout:  # wait until training is under way (past the stop's construction)
        lines.append(line)
        if re.search(r"step 3: loss", line):
            break
    pids = rank_pids(p.pid)
    if 1 not in pids:
        p.kill()
        fail("could not find rank 1's process under dopt-run", "".join(lines))
    os.kill(pids[1], signal.SIGINT)  # Ctrl-C on one rank only
    try:
        rest, _ = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        fail("the ranks did not stop within 60 s of a SIGINT to rank 1", "".join(lines))
    out = "".join(lines) + rest
    if p.returncode != 0:
        fail("exit status %d after a SIGINT to rank 1" % p.returncode, out)
    m = re.search(r"stopped after step (\d+): checkpoint (\S+) written", out)
    if not m:
        fail("no final checkpoint reported after a SIGINT to rank 1", out)
    s = int(m.group(1))
    final = os.path.join(ckpt, "step-%08d" % s)
    if not os.path.isfile(os.path.join(final, "checkpoint.json")):
        fail("the final checkpoint %s is not complete" % final, out)
    print("ok: SIGINT to rank 1 of 3 processes: every rank stopped after step %d, %s written" % (s, final))

    end = s + 10
    d_resumed, o1 = r.run("processes", 2, ckpt, "--steps", str(end))
    if "resumed at step %d" % s not in o1:
        fail("the 2-process run did not resume at step %d" % s, o1)
    replay = r.folder()
    _, o2 = r.run("simulated", 3, replay, "--steps", str(end), "--stop-at", str(s))
    d_replayed, o3 = r.run("simulated", 2, replay, "--steps", str(end))
    same("stopped by SIGINT at 3 processes and resumed at 2 = --stop-at %d at 3 simulated ranks resumed at 2" % s,
         d_resumed, d_replayed, out, o1, o2, o3)
    _, o4 = r.run("simulated", 3, r.folder(), "--steps", str(end))
    a, b = last_loss(o1), last_loss(o4)
    if abs(a - b) > 1e-5 * abs(b):
        fail("resumed at 2 ranks the loss ends at %r, uninterrupted at 3 ranks at %r" % (a, b), o1, o4)
    print("ok: the loss at step %d resumed at 2 ranks (%r) is the uninterrupted 3-rank run's (%r) within 1e-5"
          % (end, a, b))


def main():
    if len(sys.argv) < 4:
        fail("usage: check_trainer.py TRAINER DOPT_RUN plain|world N|ctrl-c")
    trainer, dopt_run, scenario = sys.argv[1:4]
    with tempfile.TemporaryDirectory(prefix="dopt-example-trainer-") as tmp:
        r = Runner(trainer, dopt_run, tmp)
        if scenario == "plain":
            plain(r)
        elif scenario == "world":
            world(r, int(sys.argv[4]))
        elif scenario == "ctrl-c":
            ctrl_c(r)
        else:
            fail("unknown scenario " + scenario)


if __name__ == "__main__":
    main()
