"""docs/python-sharded.md's example of dopt.fully_shard (ZeRO stage 3), run by CTest
under torchrun at 2 ranks:

    python3 -m dopt.run --nproc_per_node 2 python/tests/fully_shard_example.py

Trains a small regression model with sharded parameters and checks that the
loss fell and that no rank holds a parameter in full between iterations."""
import torch
import torch.distributed as dist
import torch.nn as nn

import dopt


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(32, 16, generator=g)
    return x, x[:, :1] * 2.0 - x[:, 1:2]


def main():
    dist.init_process_group("gloo")  # torchrun's environment; dopt joins from it too
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
    # Shards every Linear over the ranks; the model's parameters are empty from here on.
    opt = dopt.fully_shard(model, torch.optim.Adam, lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=50, gamma=0.5)
    losses = []
    for step in range(150):
        x, y = batch(rank, step)
        loss = nn.functional.mse_loss(model(x), y)  # each Linear is gathered, used and freed
        loss.backward()  # gathered again, its gradients averaged onto the ranks' shards
        opt.step()       # Adam on this rank's shards only
        sched.step()
        losses.append(loss.item())
    full = opt.full_parameters()  # a collective: {name: full tensor}, for a checkpoint or evaluation
    held = sum(opt.shard_numels())
    total = sum(t.numel() for t in full.values())
    assert all(p.numel() == 0 for p in model.parameters()), "a parameter is held in full between iterations"
    assert losses[-1] < 0.2 * losses[0], f"the loss did not fall: {losses[0]:.4f} -> {losses[-1]:.4f}"
    print(f"fully_shard_example: rank {rank} holds {held} of {total} elements, loss {losses[0]:.4f} -> "
          f"{losses[-1]:.4f}, PASS", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
