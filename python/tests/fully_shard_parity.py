"""dopt.fully_shard (ZeRO stage 3 through module and autograd hooks) against
stage 1 under ``mp.spawn`` with gloo:

    fully_shard_parity.py N

Each rank trains a small MLP (three Linear layers, tanh) sharded with
``dopt.fully_shard`` and, beside it, the same model whole with dopt's
``ZeroRedundancyOptimizer`` (stage 1, dopt's kernels) whose gradients are
averaged as dopt's Reducer does (divided by N, then dopt's all_reduce). The
inputs differ per rank. Cases: Adam with the default units (the children),
SGD with momentum with a parameter of the root and explicit units (the last
layer joins the root's unit).

* After every step each full parameter (``full_parameters()``) must equal
  stage 1's bit for bit (torch.equal); at the end the consolidated optimizer
  states too, and stage 1's parameters loaded into a fresh sharded model
  (``load_full_parameters``) read back equal.
* A forward under no_grad between steps gives stage 1's outputs and
  changes nothing.
* Between the forward and the backward no parameter is held in full (the
  backward gathers each unit again; dopt keeps one unit's gather buffer for
  reuse). Between iterations every parameter is empty, nothing is gathered,
  the shards are ceil(numel_u / N) per unit and ``bytes`` is the shards,
  their gradients and the optimizer's state (16 B per element with Adam,
  12 with SGD and momentum, plus Adam's step counters).
* Both cases run with each ``backward_prefetch`` ("before_backward", the
  default, and "after_gradients"): the results are the same bit for bit.
* The backward holds three unit-sized buffers with "before_backward" and two
  with "after_gradients" (``buffer_bytes``, sampled at each unit's forward
  and at its output's gradient; torch's BackwardPrefetch.BACKWARD_PRE and
  BACKWARD_POST give the same) when ``dopt._storage`` is built (the gathered
  memory becomes the gradients'); without it the case says it is skipped.
* Re-entrant activation checkpointing (``torch.utils.checkpoint`` with
  ``use_reentrant=True``) around two units trains bitwise as without it.
* The errors: step() before a backward, a backward_prefetch that is not
  one of the choices (a wrong name, None), an optimizer stage 3 cannot step,
  a unit outside the module, a module sharded twice, a second backward
  before step(), a weight tied across two units, a float64 parameter, a
  wrong shape for load_full_parameters: each names the call and the
  parameter or unit.
* One rank passes the other backward_prefetch (the last rank, then rank 0):
  every rank raises ValueError at construction naming the call, its rank
  and each rank's value (the group's timeout is short meanwhile: a rank left
  waiting fails the case); a rank passing None raises its own error and the
  others name it.
* What is not sharded takes rank 0's values: a frozen parameter and a
  buffer made different on each rank are equal after fully_shard.
* A unit whose output is an object dopt cannot look into (a dataclass
  holding a tensor) trains as its plain counterpart does.

Prints "fully_shard_parity: PASS <case>" per case and rank.
"""
import enum
import os
import sys
import tempfile
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

import dopt

STEPS = 6


class MLP(nn.Module):
    """Three Linear layers with tanh; ``scale``: a parameter of the root itself."""

    def __init__(self, scale=False):
        super().__init__()
        self.fc1 = nn.Linear(12, 24)
        self.fc2 = nn.Linear(24, 17)
        self.fc3 = nn.Linear(17, 5)
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 5)) if scale else None

    def forward(self, x):
        y = self.fc3(torch.tanh(self.fc2(torch.tanh(self.fc1(x)))))
        return y * self.scale if self.scale is not None else y


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(8, 12, generator=g), torch.randn(8, 5, generator=g)


def stage1_step(model, opt, x, y, world):
    """Stage 1: the whole model, gradients averaged as the Reducer does."""
    opt.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    for p in model.parameters():
        p.grad.div_(world.size())
        world.all_reduce(p.grad)
    opt.step()


def check_held(opt, model, total, per_element, case):
    """Between iterations: only the shards (``total``: the model's elements;
    ``per_element``: bytes kept per shard element)."""
    n = opt.world_size
    for name, p in model.named_parameters():
        if p.numel() != 0:
            raise AssertionError(f"{case}: parameter {name} holds {p.numel()} elements between iterations")
    if opt.gathered_bytes != 0:
        raise AssertionError(f"{case}: {opt.gathered_bytes} bytes still gathered between iterations")
    unit_numels = opt.unit_numels()
    if sum(unit_numels) != total:
        raise AssertionError(f"{case}: the units hold {sum(unit_numels)} elements, the model {total}")
    expected = [-(-k // n) for k in unit_numels]
    shards = opt.shard_numels()
    if shards != expected:
        raise AssertionError(f"{case}: shards of {shards} elements, expected ceil(unit / {n}) = {expected}")
    if sum(shards) > total // n + len(shards):
        raise AssertionError(f"{case}: {sum(shards)} elements in this rank's shards, more than {total} / {n} + padding")
    if not per_element * sum(shards) <= opt.bytes <= per_element * sum(shards) + 8 * len(shards):
        raise AssertionError(f"{case}: {opt.bytes} bytes kept, expected {per_element} per shard element")
    return sum(shards)


def check_case(case, rank, optimizer_class, kwargs, per_element, scale=False, units=None,
               prefetch="before_backward"):
    world = dopt.get_world()
    torch.manual_seed(0)
    ref = MLP(scale)
    torch.manual_seed(rank + 1)  # the other ranks' values are overwritten by rank 0's
    model = MLP(scale)
    if rank != 0 and all(torch.equal(a, b) for a, b in zip(ref.parameters(), model.parameters())):
        raise AssertionError("the ranks' models must start apart (rank 0's values are broadcast)")
    if rank == 0:
        model.load_state_dict(ref.state_dict())
    z = dopt.ZeroRedundancyOptimizer(ref.parameters(), optimizer_class=optimizer_class, **kwargs)
    opt = dopt.fully_shard(model, optimizer_class, units=None if units is None else units(model),
                           backward_prefetch=prefetch, **kwargs)
    if opt.backward_prefetch != prefetch:
        raise AssertionError(f"{case}: backward_prefetch {opt.backward_prefetch!r}, passed {prefetch!r}")
    names = dict(ref.named_parameters())
    total = sum(p.numel() for p in ref.parameters())
    for step in range(STEPS):
        x, y = batch(rank, step)
        if step % 2 == 1:  # an evaluation forward between steps: gathers and frees, no backward
            with torch.no_grad():
                if not torch.equal(model(x), ref(x)):
                    raise AssertionError(f"{case}, step {step}: a forward under no_grad differs from stage 1's")
        stage1_step(ref, z, x, y, world)
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        # dopt keeps the last gather buffer given back for the next gather (one unit, until step()).
        spare = 4 * opt.world_size * max(opt.shard_numels())
        if any(p.numel() for p in model.parameters()) or opt.gathered_bytes > spare:
            raise AssertionError(f"{case}, step {step}: full parameters held between the forward and the backward "
                                 f"({opt.gathered_bytes} bytes gathered)")
        loss.backward()  # gathers each unit again
        opt.step()
        shard_elements = check_held(opt, model, total, per_element, case)
        full = opt.full_parameters()
        for name, p in full.items():
            if not torch.equal(p, names[name].detach()):
                raise AssertionError(f"{case}, step {step}, {name}: max |stage 3 - stage 1| = "
                                     f"{(p - names[name]).abs().max().item()}")
    z.consolidate_state_dict(to=0)
    mine = opt.state_dict()
    if rank == 0:
        theirs = z.state_dict()
        index = {n: i for i, (n, _) in enumerate(ref.named_parameters())}
        for i, name in enumerate(opt.param_names):
            for k, v in theirs["state"][index[name]].items():
                w = mine["state"][i][k]
                if not torch.equal(torch.as_tensor(w), torch.as_tensor(v)):
                    raise AssertionError(f"{case}: state {name}.{k} differs from stage 1's")
    # A fresh sharded model from stage 1's parameters: the same full values on every rank.
    fresh = MLP(scale)
    again = dopt.fully_shard(fresh, optimizer_class, units=None if units is None else units(fresh), **kwargs)
    again.load_full_parameters(dict(ref.named_parameters()))
    for name, p in again.full_parameters().items():
        if not torch.equal(p, names[name].detach()):
            raise AssertionError(f"{case}: load_full_parameters: {name} differs from the values loaded")
    print(f"fully_shard_parity: PASS {case} (rank {rank} of {opt.world_size}, {len(opt.units)} units, "
          f"{shard_elements} of {total} elements held, {opt.bytes} bytes)", flush=True)


def expect_error(cls, words, fn):
    try:
        fn()
    except cls as e:
        if not all(w in str(e) for w in words):
            raise AssertionError(f"the {cls.__name__} does not name {words}: {e}") from None
        return
    raise AssertionError(f"no {cls.__name__} ({words})")


def check_errors(rank):
    torch.manual_seed(0)
    model = MLP()
    opt = dopt.fully_shard(model, torch.optim.Adam, lr=0.01)
    expect_error(dopt.StateError, ["FullyShardedOptimizer.step", "[rank ", "call loss.backward() before step()"], opt.step)
    expect_error(dopt.NotSupportedError, ["ShardedUnits", "Muon", "stages 1 and 2"],
                 lambda: dopt.fully_shard(MLP(), "Muon", lr=0.02))
    expect_error(dopt.ValueError, ["dopt.fully_shard", "unit 0", "not a submodule"],
                 lambda: dopt.fully_shard(MLP(), torch.optim.Adam, units=[nn.Linear(2, 2)], lr=0.01))
    expect_error(dopt.ValueError, ["dopt.fully_shard", "[rank ", "backward_prefetch='after_backward'",
                                   "'before_backward'", "'after_gradients'"],
                 lambda: dopt.fully_shard(MLP(), torch.optim.Adam, backward_prefetch="after_backward", lr=0.01))
    expect_error(dopt.ValueError, ["dopt.fully_shard", "backward_prefetch=None", "None is not a choice"],
                 lambda: dopt.fully_shard(MLP(), torch.optim.Adam, backward_prefetch=None, lr=0.01))
    expect_error(dopt.ValueError, ["dopt.fully_shard", "sharded already"],
                 lambda: dopt.fully_shard(model, torch.optim.Adam, lr=0.01))
    x, y = batch(rank, 0)
    nn.functional.mse_loss(model(x), y).backward()
    expect_error(dopt.StateError, ["second backward before step()", "one backward per step"],
                 lambda: nn.functional.mse_loss(model(x), y).backward())

    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)
            self.b.weight = self.a.weight

        def forward(self, x):
            return self.b(self.a(x))

    expect_error(dopt.ValueError, ["dopt.fully_shard", "'a.weight'", "shared by unit", "tied parameters"],
                 lambda: dopt.fully_shard(Tied(), torch.optim.Adam, lr=0.01))
    expect_error(dopt.TypeError, ["dopt.fully_shard", "[rank ", "'fc1.weight'", "float64"],
                 lambda: dopt.fully_shard(MLP().double(), torch.optim.Adam, lr=0.01))
    fresh = dopt.fully_shard(MLP(), torch.optim.Adam, lr=0.01)
    full = fresh.full_parameters()
    full["fc2.bias"] = torch.zeros(3)
    expect_error(dopt.ShapeError, ["load_full_parameters", "'fc2.bias'", "[3]", "[17]"],
                 lambda: fresh.load_full_parameters(full))
    print(f"fully_shard_parity: PASS errors name the call (rank {rank})", flush=True)


def rank_list(ranks):
    """'rank 2' / 'ranks 0-1, 3'."""
    parts, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        parts.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(parts)


def check_prefetch_mismatch(rank, world):
    """One rank passes the other backward_prefetch: every rank raises ValueError
    at construction, naming the call, its rank and each rank's value. The
    group's timeout is short meanwhile so that a rank left waiting fails
    instead of hanging the test; without an error the case would train
    (check_case) and fail."""
    group = dopt.get_world()
    saved = group.timeout()
    group.set_timeout(20)
    for odd, most in ((world - 1, "before_backward"), (0, "after_gradients")):
        other = "after_gradients" if most == "before_backward" else "before_backward"
        mine = other if rank == odd else most
        rest = [r for r in range(world) if r != odd]
        verb = "passes" if len(rest) == 1 else "pass"
        words = ["dopt.fully_shard", f"[rank {rank}]", "backward_prefetch", f"{rank_list([odd])} passes '{other}'",
                 f"{rank_list(rest)} {verb} '{most}'", "the same"]
        expect_error(dopt.ValueError, words,
                     lambda: check_case(f"rank {odd} passes backward_prefetch={other}", rank, torch.optim.Adam,
                                        {"lr": 0.01}, 16, prefetch=mine))
    # The last rank passes None (not a choice): it raises its own error, the
    # others name it; none waits for it.
    if rank == world - 1:
        words = ["dopt.fully_shard", f"[rank {rank}]", "backward_prefetch=None", "None is not a choice"]
    else:
        words = ["dopt.fully_shard", f"[rank {rank}]", f"{rank_list(list(range(world - 1)))} ",
                 f"rank {world - 1} passes a value that is not a choice", "the same"]
    expect_error(dopt.ValueError, words,
                 lambda: dopt.fully_shard(MLP(), torch.optim.Adam, lr=0.01,
                                          backward_prefetch=None if rank == world - 1 else "before_backward"))
    group.set_timeout(saved)
    print(f"fully_shard_parity: PASS a backward_prefetch that differs between the ranks raises ValueError on every "
          f"rank (rank {rank})", flush=True)


def check_unsharded_and_objects(rank, world):
    """Frozen parameters and buffers take rank 0's values; a unit returning a
    dataclass trains bit for bit as the same model with the tensor returned."""
    import dataclasses

    model = MLP()
    with torch.no_grad():
        model.fc1.bias.fill_(float(rank))
    model.fc1.bias.requires_grad_(False)
    model.register_buffer("seen", torch.full((3,), float(rank)))
    dopt.fully_shard(model, torch.optim.Adam, lr=0.01)
    assert torch.equal(model.fc1.bias, torch.zeros(24)), f"frozen parameter not rank 0's: {model.fc1.bias[:3]}"
    assert torch.equal(model.seen, torch.zeros(3)), f"buffer not rank 0's: {model.seen}"

    @dataclasses.dataclass
    class Out:
        y: torch.Tensor

    class Boxed(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(12, 5)

        def forward(self, x):
            return Out(self.lin(x))

    class Net(nn.Module):
        def __init__(self, boxed):
            super().__init__()
            self.first = Boxed() if boxed else nn.Linear(12, 5)
            self.second = nn.Linear(5, 5)

        def forward(self, x):
            h = self.first(x)
            return self.second(torch.tanh(h.y if isinstance(h, Out) else h))

    nets = []
    for boxed in (True, False):
        torch.manual_seed(7)
        net = Net(boxed)
        nets.append((net, dopt.fully_shard(net, torch.optim.Adam, lr=0.01)))
    for step in range(3):
        x, y = batch(rank, step)
        for net, opt in nets:
            nn.functional.mse_loss(net(x), y).backward()
            opt.step()
    a, b = (opt.full_parameters() for _, opt in nets)
    for (na, ta), tb in zip(sorted(a.items()), (t for _, t in sorted(b.items()))):
        assert torch.equal(ta, tb), f"{na}: a unit returning a dataclass trained differently"
    print(f"fully_shard_parity: PASS frozen parameters and buffers from rank 0, dataclass outputs (rank {rank})",
          flush=True)


def check_checkpoint(rank, folder):
    """The Checkpointer and save_sharded/load_sharded hold the sharded
    parameters and state: a load brings back the saved values, and training
    goes on from them as from load_state_dict + load_full_parameters."""
    torch.manual_seed(0)
    model = MLP(False)
    opt = dopt.fully_shard(model, torch.optim.Adam, lr=0.01)

    def train(m, o, steps, first):
        for step in range(first, first + steps):
            x, y = batch(rank, step)
            o.zero_grad()
            nn.functional.mse_loss(m(x), y).backward()
            o.step()

    train(model, opt, 3, 0)
    ck = dopt.Checkpointer(os.path.join(folder, "ck"))
    ck.add_optimizer("model", opt)
    ck.save(3)
    opt.save_sharded(os.path.join(folder, "shards"))
    saved_params, saved_state = opt.full_parameters(), opt.state_dict()
    train(model, opt, 2, 3)
    if all(torch.equal(p, saved_params[n]) for n, p in opt.full_parameters().items()):
        raise AssertionError("checkpoint: training after the save changed nothing")

    def same(o, what):
        for n, p in o.full_parameters().items():
            if not torch.equal(p, saved_params[n]):
                raise AssertionError(f"{what}: parameter {n} differs from the saved one")
        st = o.state_dict()["state"]
        for i, keys in saved_state["state"].items():
            for k, v in keys.items():
                if not torch.equal(torch.as_tensor(st[i][k]), torch.as_tensor(v)):
                    raise AssertionError(f"{what}: state {i}.{k} differs from the saved one")

    ck.load(3)
    same(opt, "Checkpointer.load")
    fresh = MLP(False)
    again = dopt.fully_shard(fresh, torch.optim.Adam, lr=0.01)
    again.load_sharded(os.path.join(folder, "shards"))
    same(again, "load_sharded")
    ref_model = MLP(False)
    ref = dopt.fully_shard(ref_model, torch.optim.Adam, lr=0.01)
    ref.load_full_parameters(saved_params)
    ref.load_state_dict(saved_state)
    for m, o in ((model, opt), (fresh, again), (ref_model, ref)):
        train(m, o, 2, 3)
    want = ref.full_parameters()
    for what, o in (("Checkpointer.load", opt), ("load_sharded", again)):
        for n, p in o.full_parameters().items():
            if not torch.equal(p, want[n]):
                raise AssertionError(f"{what}: after two more steps {n} differs from load_state_dict's run")
    print(f"fully_shard_parity: PASS Checkpointer and save_sharded/load_sharded (rank {rank})", flush=True)


def check_buffers(rank, prefetch, held, torch_value=None):
    """Four units of one size: the peak of ``buffer_bytes`` is ``held`` units
    in every iteration (``torch_value``: passed instead of ``prefetch``, torch's
    BackwardPrefetch member of the same meaning)."""
    if sys.modules["dopt.fully_shard"]._storage is None:  # the module (dopt.fully_shard is the function)
        print(f"fully_shard_parity: SKIP {held} unit buffers (rank {rank}): dopt._storage not built", flush=True)
        return
    torch.manual_seed(3)
    model = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(8, 8), nn.Tanh())])
    opt = dopt.fully_shard(model, torch.optim.Adam, lr=0.01,
                           backward_prefetch=prefetch if torch_value is None else torch_value)
    if opt.backward_prefetch != prefetch:
        raise AssertionError(f"{held} buffers: backward_prefetch {opt.backward_prefetch!r}, expected {prefetch!r}")
    unit = 4 * opt.world_size * max(opt.shard_numels())
    if len(set(opt.shard_numels())) != 1 or len(opt.units) != 4:
        raise AssertionError(f"two buffers: expected four units of one size, got {opt.shard_numels()}")
    peak = [0]

    def sample(*_):
        peak[0] = max(peak[0], opt.buffer_bytes)

    def hook_output(module, inputs, out):  # after fully_shard's forward hook: its gradient hook runs first
        sample()
        out.register_hook(sample)

    for m in opt.units:
        m.register_forward_hook(hook_output)
    for step in range(3):
        peak[0] = 0
        x, _ = batch(rank, step)
        model(x[:, :8]).square().sum().backward()
        opt.step()
        if peak[0] != held * unit:
            raise AssertionError(f"{prefetch}, step {step}: peak buffer_bytes {peak[0]}, {held} units are {held * unit}")
        if opt.buffer_bytes != 0:
            raise AssertionError(f"{prefetch}, step {step}: {opt.buffer_bytes} bytes after step()")
    print(f"fully_shard_parity: PASS {held} unit buffers in the backward with backward_prefetch={prefetch} "
          f"(rank {rank}, {held * unit} bytes)", flush=True)


def check_recomputation(rank):
    """Re-entrant activation checkpointing around two units (their forward
    runs again inside the backward, gathering them) trains bitwise as without."""
    import torch.utils.checkpoint as cp

    class Net(nn.Module):
        def __init__(self, recompute):
            super().__init__()
            self.a, self.b, self.c = nn.Linear(6, 6), nn.Linear(6, 6), nn.Linear(6, 3)
            self.recompute = recompute

        def forward(self, x):
            for m in (self.a, self.b):
                x = torch.tanh(cp.checkpoint(m, x, use_reentrant=True) if self.recompute else m(x))
            return self.c(x)

    full = []
    for recompute in (False, True):
        torch.manual_seed(0)
        net = Net(recompute)
        opt = dopt.fully_shard(net, torch.optim.Adam, lr=0.01)
        for step in range(4):
            x = torch.randn(5, 6, generator=torch.Generator().manual_seed(10 * step + rank), requires_grad=True)
            net(x).square().sum().backward()
            opt.step()
        full.append(opt.full_parameters())
    for name, p in full[0].items():
        if not torch.equal(p, full[1][name]):
            raise AssertionError(f"recomputation: {name} differs from the run without checkpointing")
    print(f"fully_shard_parity: PASS re-entrant checkpointing (rank {rank})", flush=True)


def worker(rank, world_size, init_file):
    """One rank; a failure's traceback reaches main through mp.spawn."""
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        os.environ.pop(var, None)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=world_size,
                            timeout=timedelta(minutes=10))
    for prefetch in ("before_backward", "after_gradients"):
        check_case(f"Adam, the children as units, backward_prefetch={prefetch}", rank, torch.optim.Adam,
                   {"lr": 0.01}, 16, prefetch=prefetch)
        check_case(f"SGD with momentum, a root parameter, units fc1 and fc2, backward_prefetch={prefetch}", rank,
                   torch.optim.SGD, {"lr": 0.05, "momentum": 0.9}, 12, scale=True, units=lambda m: [m.fc1, m.fc2],
                   prefetch=prefetch)
    try:
        from torch.distributed.fsdp import BackwardPrefetch
    except Exception:  # torch 1.13's fsdp package fails to import under Python 3.11 (a dataclass default)
        BackwardPrefetch = enum.Enum("BackwardPrefetch", "BACKWARD_PRE BACKWARD_POST")  # its class and member names
        print(f"fully_shard_parity: torch.distributed.fsdp does not import; an enum of its names stands in "
              f"(rank {rank})", flush=True)
    check_buffers(rank, "before_backward", 3)
    check_buffers(rank, "after_gradients", 2)
    check_buffers(rank, "before_backward", 3, torch_value=BackwardPrefetch.BACKWARD_PRE)
    check_buffers(rank, "after_gradients", 2, torch_value=BackwardPrefetch.BACKWARD_POST)
    check_recomputation(rank)
    check_errors(rank)
    check_prefetch_mismatch(rank, world_size)
    check_unsharded_and_objects(rank, world_size)
    check_checkpoint(rank, os.path.dirname(init_file))
    dist.barrier()
    dist.destroy_process_group()


def main():
    world_size = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    failure = None
    with tempfile.TemporaryDirectory() as d:
        try:
            mp.spawn(worker, args=(world_size, os.path.join(d, "init")), nprocs=world_size, join=True)
        except (mp.ProcessRaisedException, mp.ProcessExitedException) as e:  # a rank's traceback, or its exit
            failure = str(e)
    verdict = f"FAIL {failure}" if failure else f"all cases passed on {world_size} ranks"
    print(f"fully_shard_parity: {verdict}", flush=True)
    return 1 if failure else 0


if __name__ == "__main__":
    sys.exit(main())
