// Quoted by docs/gpu.md (tests/check_docs.py checks the quotes; CI compiles this
// file when gpu/ is built).
#include <dopt/gpu/device.hpp>
#include <dopt/gpu/fused.hpp>
#include <dopt/gpu/stream.hpp>

#include "dopt/actors/simulate.hpp"
#include "dopt/optim/adam.hpp"

void one_rank_per_gpu(dopt::RankContext& ctx, std::vector<dopt::Tensor> params, dopt::Tensor grad) {
  dopt::gpu::init();                                    // once per process
  const auto dev = dopt::Device::cuda(ctx.rank());
  dopt::optim::Adam opt(params, dopt::optim::AdamOptions(1e-3));   // params: CUDA tensors on dev
  // ... set the gradients on dev ...
  ctx.world().all_reduce(grad, dopt::ReduceOp::avg);   // NCCL
  opt.step();                                           // fused kernels, returns when done
  // or asynchronously, on this rank's stream:
  auto& s = dopt::gpu::rank_stream(ctx.rank(), dev.index);
  dopt::gpu::fused_step_async(opt, s).then([](dopt::Future<void> f) { f.get(); /* next */ });
}
