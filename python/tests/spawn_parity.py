"""dopt under torch's DDP-tutorial launch: ``mp.spawn`` and
``init_process_group("gloo", init_method=..., rank=r, world_size=n)``, with
no RANK, WORLD_SIZE, MASTER_ADDR or MASTER_PORT in the environment.

    spawn_parity.py N

Every rank checks that dopt's world is torch's (rank and size), then trains
copies of one model with torch's ZeroRedundancyOptimizer and with dopt's
(only the class differs) and requires every parameter to be bitwise equal
after every step, for torch.optim.Adam (dopt's kernels), a user-written
Python optimizer (stepped by that class under dopt's ZeRO), and, at 3 or
more ranks, over a torch subgroup of the even ranks
(``dist.new_group``). Then the consolidated state dicts must be equal.
Before any of that, at 3 or more ranks, a torch subgroup is the even
ranks' first use of dopt while the odd ranks never call dopt (they get the
placeholder's errors and no-ops). After: dopt's world waits as long as
torch's group (``timeout=``), PostLocalSGDOptimizer over torch's SGD with a
scheduler attached to that SGD equals torch's wrapper, and a parameter
frozen with bucket views stays equal on every rank (kernels and a Python
class). Last, torch's ``Join`` with uneven inputs (rank r runs 3 + r steps) and
dopt's ZeRO as the first joinable (torch's deadlocks there) must give torch's
parameters (torch's ZeRO run behind an idle first joinable).
Prints "spawn_parity: PASS <case>" per case and rank; exits non-zero on a
failure.
"""
import os
import sys
import tempfile
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.algorithms.join import Join, Joinable, JoinHook
from torch.distributed.optim import ZeroRedundancyOptimizer as TorchZero

import dopt
import dopt.averagers

STEPS = 8


class SignMomentum(torch.optim.Optimizer):
    """A user's own optimizer: momentum of the gradient's sign, in Python."""

    def __init__(self, params, lr=0.01, beta=0.9):
        super().__init__(params, {"lr": lr, "beta": beta})

    @torch.no_grad()
    def step(self, closure=None):
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is None:
                    continue
                buf = self.state[p].setdefault("buf", torch.zeros_like(p))
                buf.mul_(g["beta"]).add_(p.grad.sign())
                p.add_(buf, alpha=-g["lr"])


def model(seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g, requires_grad=True)
            for shape in [(64, 32), (32,), (32, 16), (16,), (7, 5), (300,), (3,)]]


def set_grads(params, rank, step, group):
    g = torch.Generator().manual_seed(100 * step + rank)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g)
        dist.all_reduce(p.grad, group=group)


def check_case(name, rank, cls, kwargs, group=None, members=None):
    ours, theirs = model(0), model(0)
    z_torch = TorchZero(theirs, optimizer_class=cls, process_group=group, **kwargs)
    z_dopt = dopt.ZeroRedundancyOptimizer(ours, optimizer_class=cls, process_group=group, **kwargs)
    size = dist.get_world_size(group)
    if z_dopt.world_size != size or z_dopt.rank != dist.get_rank(group):
        raise AssertionError(f"dopt's ZeRO has rank {z_dopt.rank} of {z_dopt.world_size}, torch's group "
                             f"rank {dist.get_rank(group)} of {size}")
    local = sum(p.numel() for g in z_dopt.optim.param_groups for p in g["params"])
    if size > 1 and local >= sum(p.numel() for p in ours):
        raise AssertionError(f"rank {rank} holds every parameter ({local} elements): nothing was sharded")
    for step in range(STEPS):
        set_grads(ours, rank, step, group)
        set_grads(theirs, rank, step, group)
        z_torch.step()
        z_dopt.step()
        for i, (a, b) in enumerate(zip(ours, theirs)):
            if not torch.equal(a, b):
                raise AssertionError(f"step {step}, parameter {i}: max |dopt - torch| = {(a - b).abs().max().item()}")
    first = members[0] if members else 0
    z_torch.consolidate_state_dict(to=0)
    z_dopt.consolidate_state_dict(to=0)
    if dist.get_rank(group) == 0:
        a, b = z_dopt.state_dict(), z_torch.state_dict()
        if sorted(a["state"]) != sorted(b["state"]):
            raise AssertionError(f"state dict indices differ: {sorted(a['state'])} vs {sorted(b['state'])}")
        for i in a["state"]:
            for k, v in b["state"][i].items():
                w = a["state"][i][k]
                same = torch.equal(torch.as_tensor(w).float(), torch.as_tensor(v).float())
                if not same:
                    raise AssertionError(f"state {i}.{k} differs")
    print(f"spawn_parity: PASS {name} (rank {rank}, group of {size}, first member {first}, "
          f"{'dopt kernels' if z_dopt.uses_dopt_kernels else cls.__name__ + ' steps the shard'})", flush=True)


class _Idle(Joinable):
    """A joinable that does nothing, placed first so that torch's ZeRO is not
    the first joinable (torch 1.13 deadlocks when it is)."""

    def __init__(self):
        super().__init__()

    def join_hook(self, **kwargs):
        return JoinHook()

    @property
    def join_device(self):
        return torch.device("cpu")

    @property
    def join_process_group(self):
        return dist.group.WORLD


def check_join(rank):
    """Uneven inputs (rank r has 3 + r steps) under torch's Join: dopt's ZeRO
    as the only joinable against torch's behind an idle joinable."""
    ours, theirs = model(0), model(0)
    z_dopt = dopt.ZeroRedundancyOptimizer(ours, optimizer_class=torch.optim.Adam, lr=0.01)
    z_torch = TorchZero(theirs, optimizer_class=torch.optim.Adam, lr=0.01)

    def grads(params, i):
        g = torch.Generator().manual_seed(1000 * rank + i)
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)

    with Join([z_dopt]):
        for i in range(3 + rank):
            grads(ours, i)
            z_dopt.step()
    idle = _Idle()
    with Join([idle, z_torch]):
        for i in range(3 + rank):
            grads(theirs, i)
            Join.notify_join_context(idle)
            z_torch.step()
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if not torch.equal(a, b):
            raise AssertionError(f"Join: parameter {i}: max |dopt - torch| = {(a - b).abs().max().item()}")
    print(f"spawn_parity: PASS Join with uneven inputs, dopt's ZeRO the first joinable (rank {rank})", flush=True)


def check_subgroup_first(rank, world_size):
    """A torch subgroup as the members' first use of dopt, with the other
    ranks never calling dopt: dopt's group is made among the members only.
    A non-member passing torch's placeholder gets a ValueError from ZeRO and
    an averager that averages nothing (torch's)."""
    evens = list(range(0, world_size, 2))
    sub = dist.new_group(evens)
    if rank in evens:
        check_case("Adam on a torch subgroup, its members' first use of dopt", rank, torch.optim.Adam,
                   {"lr": 0.01}, sub, evens)
    else:
        try:
            dopt.ZeroRedundancyOptimizer(model(0), torch.optim.SGD, process_group=sub, lr=0.1)
            raise AssertionError("a non-member's ZeRO on the subgroup was accepted")
        except ValueError as e:
            if "is not a member of the process group" not in str(e):
                raise
        av = dopt.averagers.PeriodicModelAverager(period=1, process_group=sub)
        ps = model(0)
        before = [p.detach().clone() for p in ps]
        for p in ps:
            p.grad = torch.ones_like(p)
        av.average_parameters(ps)
        if av.step != 1 or not all(torch.equal(a, b) for a, b in zip(ps, before)):
            raise AssertionError("a non-member's averager must count the step and average nothing")
        if dopt.is_initialized():
            raise AssertionError("a rank that never used dopt's world joined it")
        print(f"spawn_parity: PASS non-member of a torch subgroup (rank {rank})", flush=True)
    dist.barrier()


def check_post_local_sgd(rank):
    """PostLocalSGDOptimizer over torch's SGD used as it is: a scheduler
    attached to the local optimizer after wrapping acts, as with torch's."""
    from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
    from torch.distributed.optim import PostLocalSGDOptimizer as TorchPLSGD
    ours, theirs = model(0), model(0)
    local_d = torch.optim.SGD(ours, lr=0.1, momentum=0.9)
    local_t = torch.optim.SGD(theirs, lr=0.1, momentum=0.9)
    o_d = dopt.PostLocalSGDOptimizer(local_d, dopt.averagers.PeriodicModelAverager(period=2, warmup_steps=2))
    o_t = TorchPLSGD(local_t, PeriodicModelAverager(period=2, warmup_steps=2))
    if o_d.param_groups is not local_d.param_groups:
        raise AssertionError("the wrapper's param_groups are not the local optimizer's")
    s_d, s_t = torch.optim.lr_scheduler.StepLR(local_d, 2), torch.optim.lr_scheduler.StepLR(local_t, 2)
    for step in range(7):
        g = torch.Generator().manual_seed(10 * step + rank)
        for a, b in zip(ours, theirs):
            a.grad = torch.randn(a.shape, generator=g)
            b.grad = a.grad.clone()
        o_d.step()
        o_t.step()
        s_d.step()
        s_t.step()
        for i, (a, b) in enumerate(zip(ours, theirs)):
            if not torch.equal(a, b):
                raise AssertionError(f"PostLocalSGD step {step}, parameter {i}: max diff {(a - b).abs().max().item()}")
    if len(local_d.state) != len(ours):
        raise AssertionError("the local optimizer's state is not the one stepped")
    print(f"spawn_parity: PASS PostLocalSGDOptimizer over torch's SGD with a scheduler on it (rank {rank})", flush=True)


def check_frozen_in_buckets(rank, cls, kwargs):
    """A parameter frozen mid-training with bucket views, its gradient zeroed
    (not None): its owner still steps it, and every rank must then hold the
    owner's value (torch 1.13's ZeRO lets the copies part)."""
    ps = model(0)
    z = dopt.ZeroRedundancyOptimizer(ps, optimizer_class=cls, parameters_as_bucket_view=True, **kwargs)
    for step in range(5):
        if step == 2:
            ps[0].requires_grad_(False)
        g = torch.Generator().manual_seed(10 * step + rank)
        for p in ps:
            p.grad = torch.randn(p.shape, generator=g) if p.requires_grad else torch.zeros_like(p)
        z.step()
    for i, p in enumerate(ps):
        got = [torch.empty_like(p) for _ in range(dist.get_world_size())]
        dist.all_gather(got, p.detach().contiguous())
        if not all(torch.equal(got[0], x) for x in got[1:]):
            raise AssertionError(f"frozen in buckets ({cls.__name__}): parameter {i} differs between the ranks")
    print(f"spawn_parity: PASS a parameter frozen with bucket views stays equal on every rank, {cls.__name__} "
          f"(rank {rank})", flush=True)


def worker(rank, world_size, init_file, failures):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        os.environ.pop(var, None)
    try:
        dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=world_size,
                                timeout=timedelta(minutes=45))
        if world_size >= 3:
            check_subgroup_first(rank, world_size)
        if (dopt.get_rank(), dopt.get_world_size()) != (rank, world_size):
            raise AssertionError(f"dopt's world is rank {dopt.get_rank()} of {dopt.get_world_size()}, "
                                 f"torch's rank {rank} of {world_size}")
        check_case("Adam", rank, torch.optim.Adam, {"lr": 0.01})
        check_case("Adam, bucket views", rank, torch.optim.Adam, {"lr": 0.01, "parameters_as_bucket_view": True})
        check_case("user-written optimizer", rank, SignMomentum, {"lr": 0.01})
        check_join(rank)
        if abs(dopt.get_world().timeout() - 45 * 60) > 1:
            raise AssertionError(f"dopt's world waits {dopt.get_world().timeout()} s, torch's group 2700 s")
        check_post_local_sgd(rank)
        check_frozen_in_buckets(rank, torch.optim.Adam, {"lr": 0.01})
        check_frozen_in_buckets(rank, SignMomentum, {"lr": 0.01})
        if world_size >= 3:
            evens = list(range(0, world_size, 2))
            sub = dist.new_group(evens)
            if rank in evens:
                check_case("Adam on a torch subgroup", rank, torch.optim.Adam, {"lr": 0.01}, sub, evens)
                check_case("user-written optimizer on a torch subgroup", rank, SignMomentum, {"lr": 0.01}, sub,
                           evens)
            dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        failures.put(f"rank {rank}: {traceback.format_exc()}")
        print(f"spawn_parity: FAIL rank {rank}:\n{traceback.format_exc()}", flush=True)
        raise


def main():
    world_size = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        os.environ.pop(var, None)
    ctx = mp.get_context("spawn")
    failures = ctx.SimpleQueue()
    with tempfile.TemporaryDirectory() as d:
        try:
            mp.spawn(worker, args=(world_size, os.path.join(d, "init"), failures), nprocs=world_size, join=True)
        except Exception as e:  # the rank's own message was printed
            print(f"spawn_parity: FAIL ({type(e).__name__})", flush=True)
            return 1
    if not failures.empty():
        return 1
    print(f"spawn_parity: all cases passed on {world_size} ranks", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
