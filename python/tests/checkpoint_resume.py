"""dopt.Checkpointer under mp.spawn with torch's gloo group, in three jobs:

    checkpoint_resume.py N

1. N ranks train for 12 steps with every kind of item: a module with
   BatchNorm buffers under dopt's ZeRO (Adam on dopt's kernels, bucket
   views) with a StepLR scheduler, a torch.optim.SGD, ZeRO over a
   user-written optimizer class and torch's own ZeRO (the consolidated
   route), a per-rank module with dopt.optim.Adam, post-local SGD over
   torch's SGD, a per-rank torch.Generator that perturbs the inputs, and
   extras. One Checkpointer saves asynchronously every 2 steps up to
   step 6 (keep_last=2, training goes on while it writes), a second one
   saves step 6 synchronously. The state at step 6 and at step 12 is kept as
   the reference. The two step-6 checkpoints must hold the same tensors,
   byte for byte; errors (a bad placement, a duplicate name, a missing step,
   extras that are not JSON on one rank only) must be raised on every rank.
2. N new ranks, with other initial values, resume from each folder with
   load_latest (an incomplete step-*.tmp and a folder without checkpoint.json
   are skipped) and train to step 12: every parameter, buffer, generator
   state, the scheduler and the extras must equal the uninterrupted run's,
   bitwise.
3. At another world size (2 -> 3, 3 -> 2), the replicated items and both
   ZeROs load: the model, and the consolidated optimizer states, must equal
   step 6's, bitwise; a per-rank item is a dopt.StateDictError on every rank.

Prints "checkpoint_resume: PASS <case>" per case and rank; exits non-zero on
a failure.
"""
import json
import os
import struct
import sys
import tempfile
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.distributed.optim import ZeroRedundancyOptimizer as TorchZero

import dopt
import dopt.averagers

SAVED, STEPS = 6, 12


class DecayingSGD(torch.optim.Optimizer):
    """A user's own optimizer (ZeRO steps it in Python), with state that is
    not a tensor: SGD whose step shrinks as 1 / (1 + k) with its own count k."""

    def __init__(self, params, lr=0.05):
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                st["k"] = st.get("k", 0) + 1
                p.sub_(p.grad, alpha=group["lr"] / (1 + st["k"]))


class Job:
    """Everything one rank trains (seed: the initial values)."""

    def __init__(self, rank, seed):
        torch.manual_seed(seed)
        self.rank = rank
        self.net = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4))
        self.head = nn.Linear(4, 3)
        self.tail = nn.Linear(5, 5)
        self.side = nn.Linear(3, 4)
        torch.manual_seed(seed + 1 + rank)
        self.local = nn.Linear(6, 2)
        self.pl = nn.Linear(3, 3)
        self.gen = torch.Generator().manual_seed(seed + 100 + rank)
        self.meta = {"epoch": 0, "loss": 0.0, "note": "resume me"}

    def make_optimizers(self):
        self.zero = dopt.ZeroRedundancyOptimizer(self.net.parameters(), torch.optim.Adam, lr=0.01,
                                                 parameters_as_bucket_view=True)
        assert self.zero.uses_dopt_kernels
        self.sched = torch.optim.lr_scheduler.StepLR(self.zero, step_size=3, gamma=0.5)
        self.head_opt = torch.optim.SGD(self.head.parameters(), lr=0.05, momentum=0.9)
        self.tail_zero = dopt.ZeroRedundancyOptimizer(self.tail.parameters(), DecayingSGD, lr=0.05)
        assert not self.tail_zero.uses_dopt_kernels
        self.side_zero = TorchZero(self.side.parameters(), torch.optim.Adam, lr=0.01)
        self.local_opt = dopt.optim.Adam(self.local.parameters(), lr=0.02)
        averager = dopt.averagers.PeriodicModelAverager(period=2, warmup_steps=2)
        self.pl_opt = dopt.PostLocalSGDOptimizer(optim=torch.optim.SGD(self.pl.parameters(), lr=0.05, momentum=0.5),
                                                 averager=averager)

    def register(self, ckpt, per_rank=True):
        ckpt.add_tensors("net", self.net)  # before ZeRO re-points its parameters at the buckets
        if not hasattr(self, "zero"):
            self.make_optimizers()
        ckpt.add_optimizer("zero", self.zero)
        ckpt.add_state("sched", self.sched)
        ckpt.add_tensors("head", dict(self.head.named_parameters()))
        ckpt.add_optimizer("head_opt", self.head_opt)
        ckpt.add_tensors("tail", self.tail.state_dict())
        ckpt.add_optimizer("tail_zero", self.tail_zero)
        ckpt.add_tensors("side", self.side)
        ckpt.add_optimizer("side_zero", self.side_zero)
        if per_rank:
            ckpt.add_tensors("local", self.local, placement="per_rank")
            ckpt.add_optimizer("local_opt", self.local_opt, placement="per_rank")
            ckpt.add_tensors("pl", self.pl, placement="per_rank")
            ckpt.add_optimizer("pl_opt", self.pl_opt)
            ckpt.add_rng("gen", self.gen)
        ckpt.add_extras("meta", self.meta)

    def step(self, step):
        world = dist.get_world_size()
        g = torch.Generator().manual_seed(1000 * step + self.rank)
        x = torch.randn(8, 8, generator=g) + 0.1 * torch.rand(8, 8, generator=self.gen)
        loss = nn.functional.mse_loss(self.net(x), torch.randn(8, 4, generator=g))
        loss = loss + self.head(torch.randn(8, 4, generator=g)).square().mean()
        loss = loss + self.tail(torch.randn(8, 5, generator=g)).square().mean()
        loss = loss + self.side(torch.randn(8, 3, generator=g)).square().mean()
        loss.backward()
        for m in (self.net, self.head, self.tail, self.side):
            for p in m.parameters():
                dist.all_reduce(p.grad)  # DDP's averaged gradients
                p.grad.div_(world)
        for b in self.net.buffers():
            dist.broadcast(b, 0)  # DDP's buffers, from rank 0
        self.zero.step()
        self.sched.step()
        self.head_opt.step()
        self.tail_zero.step()
        self.side_zero.step()
        self.local(torch.randn(4, 6, generator=self.gen)).square().mean().backward()
        self.local_opt.step()
        self.pl(torch.randn(4, 3, generator=g)).square().mean().backward()
        self.pl_opt.step()
        for o in (self.zero, self.head_opt, self.tail_zero, self.side_zero, self.local_opt, self.pl_opt):
            o.zero_grad(set_to_none=True)
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        self.meta["epoch"] = (step + 1) // 4
        self.meta["loss"] = float(mean) / world  # the same on every rank (the extras are replicated)

    def tensors(self):
        """Every value that must resume: parameters, buffers, the generator, the extras."""
        out = {}
        for name in ("net", "head", "tail", "side", "local", "pl"):
            for k, v in getattr(self, name).state_dict().items():
                out[f"{name}.{k}"] = v.clone()
        out["gen"] = self.gen.get_state().clone()
        out["sched"] = self.sched.state_dict()
        out["meta"] = dict(self.meta)
        return out

    def consolidated(self):
        """Collective: the global state of the replicated and ZeRO optimizers (on rank 0)."""
        self.zero.consolidate_state_dict(0)
        self.tail_zero.consolidate_state_dict(0)
        self.side_zero.consolidate_state_dict(0)
        out = {"head_opt": self.head_opt.state_dict()}
        if self.rank == 0:
            out["zero"] = self.zero.state_dict()
            out["tail_zero"] = self.tail_zero.state_dict()
            out["side_zero"] = self.side_zero.state_dict()
        return out


def same(a, b, where):
    """Bitwise equality of nested state (tensors: dtype, shape and every bit)."""
    if isinstance(a, torch.Tensor):
        if not (isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)):
            raise AssertionError(f"{where}: {a} != {b}")
    elif isinstance(a, dict):
        if not isinstance(b, dict) or set(a) != set(b):
            raise AssertionError(f"{where}: {a} != {b}")
        for k in a:
            same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        if len(a) != len(b):
            raise AssertionError(f"{where}: {a} != {b}")
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{where}[{i}]")
    elif a != b:
        raise AssertionError(f"{where}: {a!r} != {b!r}")


def payload(path):
    """A safetensors file's tensors (header entries and bytes), without its metadata."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        header.pop("__metadata__", None)
        return header, f.read()


def expect_error(cls, f, text, where):
    try:
        f()
    except cls as e:
        if text not in str(e):
            raise AssertionError(f"{where}: the {cls.__name__} does not say '{text}': {e}") from None
        return
    raise AssertionError(f"{where}: no {cls.__name__} was raised")


def passed(rank, case):
    print(f"checkpoint_resume: PASS {case} (rank {rank})", flush=True)


# --- 1. train and save ----------------------------------------------------------------------

def train_and_save(rank, world, tmp):
    job = Job(rank, seed=0)
    async_ckpt = dopt.Checkpointer(os.path.join(tmp, "async"), keep_last=2)
    job.register(async_ckpt)
    sync_ckpt = dopt.Checkpointer(os.path.join(tmp, "sync"), process_group=dist.group.WORLD)
    job.register(sync_ckpt)
    bg_ckpt = dopt.Checkpointer(os.path.join(tmp, "background"), background_snapshot=True)
    job.register(bg_ckpt)
    if sync_ckpt.load_latest() is not None:
        raise AssertionError("load_latest found a checkpoint in an empty folder")
    pending = None
    for step in range(STEPS):
        bg_ckpt.wait_snapshot()  # before the step writes what the background snapshot reads
        job.step(step)
        done = step + 1
        if done == SAVED:
            sync_ckpt.save(done)
            bg_ckpt.save_async(done)  # returns before the CPU tensors are copied
            torch.save({"tensors": job.tensors(), "optimizers": job.consolidated()},
                       os.path.join(tmp, f"saved-rank{rank}.pt"))
        if done % 2 == 0 and done <= SAVED:
            if pending is not None:
                pending.wait()
            pending = async_ckpt.save_async(done)  # training goes on while it is written
    pending.wait()
    async_ckpt.wait()
    bg_ckpt.wait()
    torch.save(job.tensors(), os.path.join(tmp, f"final-rank{rank}.pt"))
    kept = sorted(os.listdir(os.path.join(tmp, "async")))
    if kept != ["step-00000004", "step-00000006"]:
        raise AssertionError(f"keep_last=2 left {kept}")
    passed(rank, "save_async every 2 steps with keep_last=2 while training goes on")
    if rank == 0:
        s = os.path.join(tmp, "sync", "step-00000006")
        for kind in ("async", "background"):
            a = os.path.join(tmp, kind, "step-00000006")
            files = sorted(os.path.relpath(os.path.join(r, f), a) for r, _, fs in os.walk(a) for f in fs)
            if files != sorted(os.path.relpath(os.path.join(r, f), s) for r, _, fs in os.walk(s) for f in fs):
                raise AssertionError(f"the {kind} and the sync checkpoint hold different files")
            for f in files:
                if f.endswith(".safetensors") and payload(os.path.join(a, f)) != payload(os.path.join(s, f)):
                    raise AssertionError(f"{f}: the {kind} and the sync save wrote different tensors")
        passed(rank, f"save_async wrote the tensors save wrote, byte for byte ({len(files)} files), also with "
                     "background_snapshot and training going on after wait_snapshot()")
    check_errors(rank, world, tmp, job)


def check_errors(rank, world, tmp, job):
    ckpt = dopt.Checkpointer(os.path.join(tmp, "errors"))
    expect_error(ValueError, lambda: ckpt.add_tensors("x", {"w": torch.zeros(2)}, placement="everywhere"),
                 "placement", "a bad placement")
    ckpt.add_tensors("x", {"w": torch.zeros(2)})
    expect_error(dopt.ValueError, lambda: ckpt.add_tensors("x", {"v": torch.zeros(2)}), "already registered",
                 "a name used twice")
    expect_error(dopt.ValueError, lambda: ckpt.add_tensors("t", {"w": torch.zeros(3, 2).t()}), "contiguous",
                 "a non-contiguous tensor")
    expect_error(TypeError, lambda: ckpt.add_optimizer("o", object()), "torch.optim.Optimizer",
                 "not an optimizer")
    expect_error(dopt.IOError, lambda: ckpt.load(99), "step-00000099", "a step that was never saved")
    extras = {"ok": 1} if rank != 1 else {"bad": object()}
    ckpt.add_extras("meta", extras)
    if rank == 1:
        expect_error(TypeError, lambda: ckpt.save(1), "not JSON", "extras that are not JSON")
    else:
        expect_error(dopt.Error, lambda: ckpt.save(1), "rank 1 failed", "another rank's extras that are not JSON")
    if os.path.exists(os.path.join(tmp, "errors", "step-00000001")):
        raise AssertionError("a failed save left a checkpoint")
    passed(rank, "errors on every rank (placement, a name twice, a missing step, one rank's bad extras)")


# --- 2. resume at the same world size ---------------------------------------------------------

def resume(rank, world, tmp):
    if rank == 0:  # incomplete folders a crash leaves: load_latest skips them
        os.makedirs(os.path.join(tmp, "sync", "step-00000099.tmp"))
        with open(os.path.join(tmp, "sync", "step-00000099.tmp", "replicated.safetensors"), "wb") as f:
            f.write(b"half a file")
        os.makedirs(os.path.join(tmp, "sync", "step-00000098"))
    dist.barrier()
    saved = torch.load(os.path.join(tmp, f"saved-rank{rank}.pt"))
    final = torch.load(os.path.join(tmp, f"final-rank{rank}.pt"))
    for folder in ("sync", "async"):
        job = Job(rank, seed=7)
        ckpt = dopt.Checkpointer(os.path.join(tmp, folder))
        job.register(ckpt)
        start = ckpt.load_latest()
        if start != SAVED:
            raise AssertionError(f"{folder}: load_latest returned {start}, expected {SAVED}")
        same(saved["tensors"], job.tensors(), f"{folder} at step {SAVED}")
        same(saved["optimizers"], job.consolidated(), f"{folder}, the optimizers at step {SAVED}")
        for step in range(start, STEPS):
            job.step(step)
        same(final, job.tensors(), f"{folder}, resumed, at step {STEPS}")
        passed(rank, f"resumed from the {folder} save at step {SAVED} (skipping step-00000099.tmp and a folder "
                     f"without checkpoint.json), step {STEPS} equals the uninterrupted run bitwise")


# --- 3. another world size ---------------------------------------------------------------------

def reshard(rank, world, tmp):
    saved = torch.load(os.path.join(tmp, "saved-rank0.pt"))
    job = Job(rank, seed=11)
    ckpt = dopt.Checkpointer(os.path.join(tmp, "sync"))
    job.register(ckpt, per_rank=False)
    if ckpt.load_latest() != SAVED:
        raise AssertionError("load_latest did not find step 6")
    got = job.tensors()
    for k, v in saved["tensors"].items():
        if k.split(".")[0] in ("net", "head", "tail", "side"):
            same(v, got[k], k)
    same(saved["tensors"]["meta"], got["meta"], "meta")
    same(saved["tensors"]["sched"], got["sched"], "sched")
    opts = job.consolidated()
    same(saved["optimizers"]["head_opt"], opts["head_opt"], "head_opt")
    if rank == 0:
        same(saved["optimizers"]["zero"], opts["zero"], "zero")
        same(saved["optimizers"]["tail_zero"], opts["tail_zero"], "tail_zero")
        same(saved["optimizers"]["side_zero"], opts["side_zero"], "side_zero")
    passed(rank, f"the ZeROs and the replicated items saved at another world size load at {world} ranks, "
                 "the model and the consolidated optimizer states bitwise step 6's")
    per_rank = dopt.Checkpointer(os.path.join(tmp, "sync"))
    per_rank.add_rng("gen", job.gen)
    expect_error(dopt.StateDictError, lambda: per_rank.load(SAVED), "per-rank state", "a per-rank generator")
    passed(rank, "a per-rank item at another world size is a StateDictError on every rank")


def worker(rank, world, phase, tmp):
    # No launcher variables: dopt's world is torch's group (docs/python-ranks.md, "How dopt finds its ranks").
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        os.environ.pop(var, None)
    init = "file://" + os.path.join(tmp, "init-" + phase.__name__)
    try:
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world, timeout=timedelta(minutes=5))
        phase(rank, world, tmp)
        dist.barrier()
    except BaseException:
        print(f"checkpoint_resume: FAIL rank {rank} in {phase.__name__}:\n{traceback.format_exc()}", flush=True)
        raise


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    other = 3 if n == 2 else 2
    with tempfile.TemporaryDirectory(dir=os.environ.get("DOPT_TEST_TMP")) as tmp:
        for phase, world in ((train_and_save, n), (resume, n), (reshard, other)):
            try:  # new processes for each job, as a restarted training
                mp.spawn(worker, args=(world, phase, tmp), nprocs=world, join=True)
            except Exception as e:  # the failing rank printed its traceback
                print(f"checkpoint_resume: FAIL ({type(e).__name__} in {phase.__name__})", flush=True)
                return 1
    print(f"checkpoint_resume: all cases passed ({n} ranks, then {other})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
