"""dopt's ZeroRedundancyOptimizer and PostLocalSGDOptimizer against torch's own,
in one torchrun job (gloo for torch, dopt's process group for dopt):

    python3 -m torch.distributed.run --nproc_per_node N torch_parity.py

Each case trains two copies of one torch model, one with torch's optimizer
and one with dopt's (only the import differs), and requires every parameter
to be bitwise equal after every one of 20 steps; then each side's state
dict is saved with torch.save, loaded into a fresh optimizer of the other
side, and 5 more steps must stay bitwise equal. Every rank prints
"torch_parity: PASS <case>" or "FAIL <case>: ..." and exits non-zero on a
failure.
"""
import copy
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.algorithms.model_averaging.averagers as torch_averagers
import torch.nn as nn
from torch.distributed.optim import PostLocalSGDOptimizer as TorchPostLocalSGD
from torch.distributed.optim import ZeroRedundancyOptimizer as TorchZero
from torch.nn.parallel import DistributedDataParallel as DDP

import dopt
import dopt.averagers

STEPS, MORE = 20, 5


class Net(nn.Module):
    """A small CNN on 1x12x12 images, 10 classes."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 3)
        self.conv2 = nn.Conv2d(6, 8, 3)
        self.fc1 = nn.Linear(8 * 4 * 4, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        x = torch.relu(self.conv1(x))
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(8, 1, 12, 12, generator=g), torch.randint(0, 10, (8,), generator=g)


def backward(model, rank, step):
    x, y = batch(rank, step)
    nn.functional.cross_entropy(model(x), y).backward()


class Checker:
    def __init__(self, rank):
        self.rank = rank
        self.failures = []

    def params(self, a, b, case, step):
        for i, (p, q) in enumerate(zip(a.parameters(), b.parameters())):
            if not torch.equal(p, q):
                d = (p - q).abs().max().item()
                self.failures.append(f"{case}: parameter {i} differs after step {step} (max |diff| {d:g})")
                return False
        return True

    def state_dicts(self, a, b, case):
        if set(a["state"]) != set(b["state"]):
            self.failures.append(f"{case}: state dicts hold different parameters")
            return
        for i in a["state"]:
            for k, v in a["state"][i].items():
                w = b["state"][i].get(k)
                same = torch.equal(v, w) if torch.is_tensor(v) and torch.is_tensor(w) else v == w
                if not same:
                    self.failures.append(f"{case}: state {i}.{k} differs between torch and dopt")
        for g, h in zip(a["param_groups"], b["param_groups"]):
            for k in g:
                if k in h and g[k] != h[k] and not (isinstance(g[k], (tuple, list)) and tuple(g[k]) == tuple(h[k])):
                    self.failures.append(f"{case}: param group key {k}: {g[k]!r} vs {h[k]!r}")

    def report(self, case, before):
        ok = len(self.failures) == before
        if ok:
            print(f"torch_parity [rank {self.rank}]: PASS {case}", flush=True)
        for f in self.failures[before:]:  # each names its case
            print(f"torch_parity [rank {self.rank}]: FAIL {f}", flush=True)


def zero_case(chk, rank, tmp, bucket_view, optimizer, kwargs, groups=False, scheduler=False):
    case = (f"ZeroRedundancyOptimizer({optimizer.__name__}, parameters_as_bucket_view={bucket_view}"
            + (", two param groups" if groups else "") + (", StepLR" if scheduler else "") + ")")
    before = len(chk.failures)
    torch.manual_seed(0)
    net = Net()
    mt, md = DDP(copy.deepcopy(net)), DDP(copy.deepcopy(net))

    def params_of(m):
        if not groups:
            return m.parameters()
        ps = list(m.parameters())
        return [{"params": ps[:4]}, {"params": ps[4:], "lr": kwargs["lr"] / 2}]

    def make(m, cls):
        return cls(params_of(m), optimizer, parameters_as_bucket_view=bucket_view, **kwargs)

    ot, od = make(mt, TorchZero), make(md, dopt.ZeroRedundancyOptimizer)
    st = torch.optim.lr_scheduler.StepLR(ot, 7, 0.5) if scheduler else None
    sd_ = torch.optim.lr_scheduler.StepLR(od, 7, 0.5) if scheduler else None
    for step in range(STEPS):
        for m, o, s in ((mt, ot, st), (md, od, sd_)):
            o.zero_grad(set_to_none=(step % 3 == 2))
            backward(m, rank, step)
            o.step()
            if s:
                s.step()
        if not chk.params(mt, md, case, step):
            break
    # The state dicts cross: torch's saved and loaded into dopt, dopt's into torch.
    for o in (ot, od):
        o.consolidate_state_dict(to=0)
    path_t, path_d = os.path.join(tmp, "zero_torch.pt"), os.path.join(tmp, "zero_dopt.pt")
    if rank == 0:
        sd_t, sd_d = ot.state_dict(), od.state_dict()
        chk.state_dicts(sd_t, sd_d, case)
        torch.save(sd_t, path_t)
        torch.save(sd_d, path_d)
    dist.barrier()
    del ot, od
    ot, od = make(mt, TorchZero), make(md, dopt.ZeroRedundancyOptimizer)
    ot.load_state_dict(torch.load(path_d))
    od.load_state_dict(torch.load(path_t))
    for step in range(STEPS, STEPS + MORE):
        for m, o in ((mt, ot), (md, od)):
            o.zero_grad()
            backward(m, rank, step)
            o.step()
        if not chk.params(mt, md, case + " after crossing the state dicts", step):
            break
    if bucket_view:  # every torch parameter is a view of one of dopt's buckets
        ranges = [(b.data_ptr, b.data_ptr + 4 * b.numel) for kind in od._c.buckets for b in kind]
        for i, p in enumerate(md.parameters()):
            if not any(lo <= p.data_ptr() < hi for lo, hi in ranges):
                chk.failures.append(f"{case}: parameter {i} is not a view of dopt's buckets")
    dist.barrier()
    chk.report(case, before)


def post_local_sgd_case(chk, rank, tmp, local, kwargs, hierarchical=False, dopt_local=False):
    period, warmup = 4, 8
    case = (f"PostLocalSGDOptimizer({'dopt.optim.' if dopt_local else 'torch.optim.'}{local.__name__}, "
            + ("HierarchicalModelAverager({4: world}) vs torch's Periodic" if hierarchical
               else "PeriodicModelAverager") + f"(period={period}, warmup_steps={warmup}))")
    before = len(chk.failures)
    torch.manual_seed(1)
    mt = Net()
    md = copy.deepcopy(mt)

    def make_t(m):
        return TorchPostLocalSGD(optim=local(m.parameters(), **kwargs),
                                 averager=torch_averagers.PeriodicModelAverager(period=period, warmup_steps=warmup))

    def make_d(m):
        if hierarchical:
            av = dopt.averagers.HierarchicalModelAverager({period: dist.get_world_size()}, warmup_steps=warmup)
        else:
            av = dopt.averagers.PeriodicModelAverager(period=period, warmup_steps=warmup)
        # torch's optimizer as it is (dopt averages), or dopt's of the same class (dopt's kernels step).
        cls = getattr(dopt.optim, local.__name__) if dopt_local else local
        return dopt.PostLocalSGDOptimizer(optim=cls(m.parameters(), **kwargs), averager=av)

    ot, od = make_t(mt), make_d(md)
    for step in range(STEPS):
        for m, o in ((mt, ot), (md, od)):
            o.zero_grad()
            backward(m, rank, step)  # local SGD: each rank its own gradients, no all-reduce
            o.step()
        if not chk.params(mt, md, case, step):
            break
    sd_t, sd_d = ot.state_dict(), od.state_dict()
    chk.state_dicts(sd_t, sd_d, case)
    if sd_t["step"] != sd_d["step"]:
        chk.failures.append(f"{case}: averager step {sd_t['step']} vs {sd_d['step']}")
    path_t, path_d = os.path.join(tmp, f"plsgd_torch_{rank}.pt"), os.path.join(tmp, f"plsgd_dopt_{rank}.pt")
    torch.save(sd_t, path_t)
    torch.save(sd_d, path_d)
    ot, od = make_t(mt), make_d(md)
    ot.load_state_dict(torch.load(path_d))
    od.load_state_dict(torch.load(path_t))
    for step in range(STEPS, STEPS + MORE):
        for m, o in ((mt, ot), (md, od)):
            o.zero_grad()
            backward(m, rank, step)
            o.step()
        if not chk.params(mt, md, case + " after crossing the state dicts", step):
            break
    dist.barrier()
    chk.report(case, before)


def main():
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    # dopt's world: from torchrun's environment; its rendezvous port comes through torch's store.
    dopt.init_process_group()
    chk = Checker(rank)
    tmp = os.environ.get("DOPT_TEST_TMP") or tempfile.gettempdir()
    if rank == 0:
        tmp = tempfile.mkdtemp(prefix="dopt-parity-", dir=tmp)
    shared = [tmp]
    dist.broadcast_object_list(shared, src=0)
    tmp = shared[0]
    adam = dict(lr=0.01, weight_decay=0.01)
    zero_case(chk, rank, tmp, False, torch.optim.Adam, adam)
    zero_case(chk, rank, tmp, True, torch.optim.Adam, adam)
    zero_case(chk, rank, tmp, True, torch.optim.SGD, dict(lr=0.05, momentum=0.9), groups=True, scheduler=True)
    zero_case(chk, rank, tmp, False, torch.optim.AdamW, dict(lr=0.01), groups=True)
    post_local_sgd_case(chk, rank, tmp, torch.optim.SGD, dict(lr=0.05, momentum=0.9))
    post_local_sgd_case(chk, rank, tmp, torch.optim.SGD, dict(lr=0.05, momentum=0.9), dopt_local=True)
    post_local_sgd_case(chk, rank, tmp, torch.optim.Adam, dict(lr=0.01))
    post_local_sgd_case(chk, rank, tmp, torch.optim.Adam, dict(lr=0.01), dopt_local=True)
    post_local_sgd_case(chk, rank, tmp, torch.optim.SGD, dict(lr=0.05), hierarchical=True)
    dist.barrier()
    dopt.destroy_process_group()
    dist.destroy_process_group()
    if chk.failures:
        sys.exit(1)


if __name__ == "__main__":
    main()
