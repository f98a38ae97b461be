"""A torch training script with DDP and ZeRO, where dopt computes the optimizer.
The only change from torch's version is the import of ZeroRedundancyOptimizer.

    python3 -m torch.distributed.run --nproc_per_node 2 examples/python/zero_ddp.py
    (PYTHONPATH must reach the built package: build/python)
"""
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from dopt import ZeroRedundancyOptimizer  # was: from torch.distributed.optim import ZeroRedundancyOptimizer


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(64, 16, generator=g)
    return x, x[:, :4].sum(1, keepdim=True)  # a target the model can learn


def main():
    dist.init_process_group("gloo")  # torchrun's environment; dopt joins from it too
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)))
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam,
                                  parameters_as_bucket_view=True, lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=100, gamma=0.5)
    losses = []
    for step in range(200):
        x, y = batch(rank, step)
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()  # DDP averages the gradients
        opt.step()       # dopt: Adam on this rank's shard, then the shards are broadcast
        sched.step()
        losses.append(loss.item())
    # A checkpoint in torch's layout: torch's own ZeroRedundancyOptimizer loads it too.
    opt.consolidate_state_dict(to=0)
    if rank == 0:
        with tempfile.TemporaryDirectory() as d:
            torch.save(opt.state_dict(), os.path.join(d, "optim.pt"))
            saved = torch.load(os.path.join(d, "optim.pt"))
        print(f"loss {sum(losses[:10]) / 10:.4f} -> {sum(losses[-10:]) / 10:.4f}; "
              f"saved the state of {len(saved['state'])} parameters, lr {saved['param_groups'][0]['lr']}")
    dist.barrier()
    if "--check-loss-falls" in sys.argv and not sum(losses[-10:]) < 0.1 * sum(losses[:10]):
        sys.exit(f"rank {rank}: the loss did not fall")


if __name__ == "__main__":
    main()
