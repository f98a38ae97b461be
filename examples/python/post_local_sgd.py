"""Post-local SGD with dopt's optimizer and averager in a torch script: each rank
trains on its own data and the models are averaged every 4 steps after 20.

    python3 -m torch.distributed.run --nproc_per_node 2 examples/python/post_local_sgd.py
"""
import sys

import torch
import torch.nn as nn

import dopt
import dopt.averagers as averagers  # was: import torch.distributed.algorithms.model_averaging.averagers as averagers


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(64, 16, generator=g)
    return x, x[:, :4].sum(1, keepdim=True)


def main():
    rank = dopt.get_rank()  # dopt's world, from torchrun's environment (torch.distributed is not needed)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    local = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)  # or dopt.optim.SGD: dopt's kernels
    opt = dopt.PostLocalSGDOptimizer(optim=local, averager=averagers.PeriodicModelAverager(period=4, warmup_steps=20))
    losses = []
    for step in range(200):
        x, y = batch(rank, step)
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()  # local SGD step; every 4th step from step 20 on, the models are averaged
        losses.append(loss.item())
    sd = opt.state_dict()  # torch's layout plus the averager's "step", as torch's
    print(f"rank {rank}: loss {sum(losses[:10]) / 10:.4f} -> {sum(losses[-10:]) / 10:.4f}, averager step {sd['step']}")
    dopt.get_world().barrier()
    if "--check-loss-falls" in sys.argv and not sum(losses[-10:]) < 0.1 * sum(losses[:10]):
        sys.exit(f"rank {rank}: the loss did not fall")


if __name__ == "__main__":
    main()
