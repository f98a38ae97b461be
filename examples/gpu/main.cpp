// GPU: ZeRO(Adam) on CUDA parameters, one rank per GPU (NCCL puts no two
// ranks of one communicator on the same GPU): as many simulated ranks as
// there are GPUs, or, under dopt-run, the GPU of the process's local rank
// (LOCAL_RANK). The gradients are summed with an
// NCCL all_reduce (ProcessGroup picks the NCCL backend for CUDA tensors), the
// fused Adam kernels step each rank's shard on its stream and ZeRO
// broadcasts the shards over NCCL. The result is checked against the same
// training on the CPU (bitwise: the kernels follow the CPU path's operation
// order).
//
//   dopt-example-gpu            (or, with two GPUs: dopt-run --nproc-per-node 2 dopt-example-gpu)
//
// Built only with -DDOPT_ENABLE_CUDA=ON. Without a CUDA device it says so
// and exits with status 77 (CTest reports the test as skipped).
#include <atomic>
#include <cstdio>
#include <cstring>
#include <vector>

#include "dopt/actors/distributed.hpp"
#include "dopt/gpu/device.hpp"
#include "dopt/distributed/zero.hpp"
#include "dopt/runtime/launch_env.hpp"

using dopt::Device;
using dopt::Tensor;
using namespace dopt::optim;

namespace {

constexpr int kSkipped = 77;

std::vector<Tensor> make_params(Device device) {
  std::vector<Tensor> params = {Tensor::full({1024, 256}, 0.01), Tensor::zeros({1024}), Tensor::full({256, 1024}, -0.02),
                                Tensor::zeros({256})};
  if (device.is_cuda())
    for (auto& p : params) p = p.to(device);
  return params;
}

// A made-up gradient for each rank and step: element i of parameter k is
// (rank + 1) * 2^-10 * ((i % 7) - 3 + k + step). Small integers times a power
// of two, so their sum over the ranks is exact in any order (NCCL's ring does
// not add in rank order; the CPU path does).
Tensor make_grad(const Tensor& like, int rank, int k, int step) {
  Tensor g = Tensor::empty(like.shape());
  float* d = g.data<float>();
  for (std::int64_t i = 0; i < g.numel(); ++i) d[i] = float((rank + 1) * double((i % 7) - 3 + k + step) / 1024.0);
  return g;
}

// Trains 5 steps on `device`; returns rank-local copies of the final parameters on the CPU.
std::vector<Tensor> train(dopt::RankContext& ctx, Device device) {
  std::vector<Tensor> params = make_params(device);
  ZeroRedundancyOptimizer zero(params, OptimizerSpec{"Adam", {{"lr", 1e-3}}}, ZeroOptions{ctx.world()});
  for (int step = 0; step < 5; ++step) {
    for (std::size_t k = 0; k < params.size(); ++k) {
      Tensor g = make_grad(params[k], ctx.rank(), static_cast<int>(k), step);
      if (device.is_cuda()) g = g.to(device);
      ctx.world().all_reduce(g);  // sum; NCCL for CUDA tensors
      params[k].set_grad(g);
    }
    zero.step();  // fused Adam on this rank's shard, then NCCL broadcasts
  }
  std::vector<Tensor> out;
  for (auto& p : params) out.push_back(p.to(Device::cpu()));
  return out;
}

}  // namespace

int main() {
  try {
    if (!dopt::gpu::init()) {
      std::printf("no CUDA device: nothing to run (skipped)\n");
      return kSkipped;
    }
    const int devices = dopt::gpu::device_count();
    // Launched: this process's GPU is its local rank's. Simulated: rank r uses GPU r.
    const auto launched = dopt::launch_env_from_environment();
    if (launched && launched->local_rank >= devices) {
      std::fprintf(stderr, "error: local rank %d but only %d CUDA device(s): start one process per GPU\n",
                   launched->local_rank, devices);
      return 1;
    }
    dopt::RunOptions options;
    options.simulated_ranks = devices;
    std::atomic<int> mismatches{0};  // rank threads add to it concurrently
    dopt::run_distributed(
        [&](dopt::RankContext& ctx) {
          const Device dev = Device::cuda(launched ? launched->local_rank : ctx.rank());
          const std::vector<Tensor> gpu = train(ctx, dev);
          const std::vector<Tensor> cpu = train(ctx, Device::cpu());
          int bad = 0;
          for (std::size_t k = 0; k < gpu.size(); ++k)
            if (std::memcmp(gpu[k].data<float>(), cpu[k].data<float>(), gpu[k].numel() * sizeof(float)) != 0) ++bad;
          std::printf("rank %d on cuda:%d: %zu parameters after 5 ZeRO(Adam) steps, %d differ from the CPU run\n",
                      ctx.rank(), dev.index, gpu.size(), bad);
          mismatches += bad;
        },
        options);
    if (mismatches.load()) {
      std::fprintf(stderr, "error: %d parameter(s) differ between the GPU and the CPU run\n", mismatches.load());
      return 1;
    }
    std::printf("GPU and CPU runs agree bit for bit\n");
  } catch (const dopt::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
