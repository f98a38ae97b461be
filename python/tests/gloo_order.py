"""dopt's reductions in gloo's ring order against torch 1.13's own all_reduce
on gloo, in one torchrun job:

    python3 -m torch.distributed.run --nproc_per_node N gloo_order.py

For float32 and float64 buffers from 1,000 elements to past the sizes where
gloo caps its segments at 1 MiB (3,000,001 and 10,000,000 float32), every rank
divides its values by the world size and all-reduces them with torch (gloo),
and the same values go through dopt's all_reduce_coalesced (split into three
tensors, ReduceOrder ring, the division folded in: what model averaging
runs). The results must be bitwise equal. Every rank prints
"gloo_order: PASS <case>" or "FAIL <case>: ..." and exits non-zero on a
failure.
"""
import sys

import torch
import torch.distributed as dist

import dopt


def main():
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    world = dopt.init_process_group()
    failures = 0
    for dtype, numel in ((torch.float32, 1000), (torch.float32, 3000001), (torch.float32, 10000000),
                         (torch.float64, 777777)):
        case = f"{str(dtype).split('.')[-1]}[{numel}] at {n} ranks"
        g = torch.Generator().manual_seed(1000 + rank)
        x = torch.randn(numel, generator=g, dtype=torch.float64)
        x = (x * torch.pow(10.0, torch.randint(-3, 3, (numel,), generator=g).double())).to(dtype)
        ref = x / n
        dist.all_reduce(ref)
        cut = [numel // 3, numel // 3 + 1]
        parts = list(torch.split(x.clone(), cut + [numel - sum(cut)]))
        world.all_reduce_coalesced(parts, order="ring", pre_divisor=n)
        got = torch.cat(parts)
        bad = (got.view(torch.int64 if dtype == torch.float64 else torch.int32) !=
               ref.view(torch.int64 if dtype == torch.float64 else torch.int32)).nonzero().flatten()
        if bad.numel():
            failures += 1
            print(f"gloo_order: FAIL {case}: {bad.numel()} elements differ, first at {bad[:5].tolist()}", flush=True)
        else:
            print(f"gloo_order: PASS {case}", flush=True)
    dist.barrier()
    dopt.destroy_process_group()
    dist.destroy_process_group()
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
