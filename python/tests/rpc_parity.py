"""dopt.DistributedOptimizer over dopt's RPC, three workers under plain
torchrun: the trainer (rank 0) keeps its parameters on two parameter servers
(remote() of a Python function), deposits gradients into a context and
steps; after every step the remote parameters must equal, bit for bit, a
local torch.optim optimizer applying the same gradients (what torch's
DistributedOptimizer computes with its functional optimizers). Also: rpc_sync
with picklable results, remote errors raised on the caller, RRef(tensor)
sharing memory on its owner. dopt's rendezvous port comes through
torchrun's agent store (torch.distributed is not initialised here).

    python3 -m torch.distributed.run --nproc_per_node 3 rpc_parity.py
"""
import sys

import torch

import dopt
import dopt.rpc as rpc

SHAPES = [(4, 3), (3,), (5,)]


def make_param(shape, seed):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def add(x, y):
    return x + y


def fail(text):
    raise ValueError(text)


def scale_owned(_):
    """Runs on a parameter server: the tensor it published with RRef(t) (waits until it did)."""
    import time
    deadline = time.monotonic() + 30
    while not _published_done and time.monotonic() < deadline:
        time.sleep(0.01)
    return float(_published[0].sum())


_published = []
_published_done = []


def main():
    rank = int(__import__("os").environ["RANK"])
    names = ["trainer", "ps1", "ps2"]
    rpc.init_rpc(names[rank])
    failures = []
    if rank == 0:
        owners = ["ps1", "ps2", "ps1"]
        refs = [rpc.remote(o, make_param, args=(s, i)) for i, (o, s) in enumerate(zip(owners, SHAPES))]
        local = [make_param(s, i).requires_grad_() for i, s in enumerate(SHAPES)]
        opt = dopt.DistributedOptimizer(torch.optim.Adam, refs, lr=0.05, weight_decay=0.01)
        ref_opt = torch.optim.Adam(local, lr=0.05, weight_decay=0.01)
        x = torch.randn(6, 4, generator=torch.Generator().manual_seed(9))
        for step in range(10):
            ws = [r.to_here().requires_grad_() for r in refs]
            loss = (torch.tanh(x @ ws[0] + ws[1]).sum(1, keepdim=True) * ws[2]).square().mean()
            grads = torch.autograd.grad(loss, ws)
            with rpc.context() as ctx:
                ctx.deposit_all(list(zip(refs, grads)))
                opt.step(ctx)
            ref_opt.zero_grad()
            for p, g in zip(local, grads):
                p.grad = g.clone()
            ref_opt.step()
            for i, (r, p) in enumerate(zip(refs, local)):
                if not torch.equal(r.to_here(), p.detach()):
                    failures.append(f"step {step}: parameter {i} on {owners[i]} differs from torch.optim.Adam")
        if not torch.equal(rpc.rpc_sync("ps2", add, args=(torch.ones(2), 3)), torch.full((2,), 4.0)):
            failures.append("rpc_sync(add) returned a wrong value")
        try:
            rpc.rpc_sync("ps1", fail, args=("bad input",))
            failures.append("a remote ValueError was not raised on the caller")
        except ValueError as e:
            if "bad input" not in str(e):
                failures.append(f"the remote error lost its text: {e}")
        if rpc.rpc_sync("ps1", scale_owned, args=(0,)) != 6.0:
            failures.append("the owner's RRef(tensor) does not share the tensor's memory")
    else:
        t = torch.zeros(3)
        _published.append(t)
        own = rpc.RRef(t)
        t.fill_(2.0)  # seen through the RRef: it shares t's memory
        _published_done.append(True)
        if not torch.equal(own.local_value(), t) or own.owner_name() != names[rank]:
            failures.append("RRef(tensor) on its owner")
    rpc.shutdown()
    for f in failures:
        print(f"rpc_parity [rank {rank}]: FAIL {f}", flush=True)
    if not failures:
        print(f"rpc_parity [rank {rank}]: PASS DistributedOptimizer(Adam) over 2 owners, rpc_sync, remote errors, "
              "RRef(tensor)", flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
