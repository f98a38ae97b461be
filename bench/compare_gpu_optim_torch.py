#!/usr/bin/env python3
"""torch's fused / foreach Adam and SGD on the GPU, measured like
dopt_bench_gpu_optim (bench/gpu_optim_bench.cpp): the same sizes, tensors of
at most --tensor-elems elements, 5 warm-up steps, then --steps timed steps
between two torch.cuda.synchronize() calls. One JSON object per line:
  {"bench":"torch_step","optimizer":"Adam","impl":"fused","params":...,"ms_per_step":...,"gb_per_s":...}
Without torch, or without CUDA in torch, it prints
  {"bench":"torch","skipped":"torch CUDA not available: <why>"}
and exits 0 (gpu/device_check/run.sh then reports that instead of a comparison).
Run it with the python3 that imports torch."""
import argparse
import json
import sys
import time


def emit(obj):
    print(json.dumps(obj), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="10000000,100000000")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--tensor-elems", type=int, default=1 << 20)
    args = ap.parse_args()
    try:
        import torch
    except Exception as e:  # noqa: BLE001 - any import failure means no comparison
        emit({"bench": "torch", "skipped": f"torch CUDA not available: import torch failed ({e})"})
        return 0
    if not torch.cuda.is_available():
        emit({"bench": "torch", "skipped": f"torch CUDA not available (torch {torch.__version__}, "
                                           f"built with CUDA {torch.version.cuda})"})
        return 0
    emit({"bench": "torch_info", "torch": torch.__version__, "cuda": torch.version.cuda,
          "device": torch.cuda.get_device_name(0)})
    dev = torch.device("cuda:0")
    sizes = [int(float(s)) for s in args.sizes.split(",") if s]
    for total in sizes:
        for name, bytes_per_elem in (("Adam", 28.0), ("SGD", 20.0)):
            for impl in ("fused", "foreach"):
                params, done = [], 0
                while done < total:
                    n = min(args.tensor_elems, total - done)
                    p = torch.full((n,), 0.5, device=dev, requires_grad=True)
                    p.grad = torch.full((n,), 1e-3, device=dev)
                    params.append(p)
                    done += n
                kw = {impl: True}
                try:
                    if name == "Adam":
                        opt = torch.optim.Adam(params, lr=1e-3, **kw)
                    else:
                        opt = torch.optim.SGD(params, lr=1e-2, momentum=0.9, **kw)
                except (TypeError, RuntimeError, ValueError) as e:
                    emit({"bench": "torch_step", "optimizer": name, "impl": impl, "params": total,
                          "skipped": f"not in torch {torch.__version__}: {e}"})
                    continue
                with torch.no_grad():
                    for _ in range(5):
                        opt.step()
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    for _ in range(args.steps):
                        opt.step()
                    torch.cuda.synchronize()
                ms = (time.perf_counter() - t0) * 1e3 / args.steps
                emit({"bench": "torch_step", "optimizer": name, "impl": impl, "params": total,
                      "tensors": len(params), "dtype": "float32", "steps": args.steps,
                      "ms_per_step": round(ms, 4), "gb_per_s": round(bytes_per_elem * total / (ms * 1e-3) / 1e9, 1)})
                del opt, params
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
