// GPU tests of the reducer, the comm hooks, the model averagers and
// PostLocalSGDOptimizer on CUDA tensors against the CPU path. Each test
// needs a CUDA device and reports itself skipped (a WARN plus SUCCEED)
// without one (as gpu.test.cpp). One rank per GPU (NCCL allows no two ranks
// of a communicator on one device): with one GPU the collectives are
// one-rank NCCL calls and the tests check the device copies, the division
// and cast kernels and the plumbing; with two GPUs the sums too (a + b is the
// same in any order). With more, NCCL's summation order is NCCL's (as
// torch's on CUDA) and the tests compare within a tolerance.
#include <catch2/catch.hpp>

#include "rank_checks.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "dopt/actors/simulate.hpp"
#include "dopt/gpu/device.hpp"
#include "dopt/distributed/averagers.hpp"
#include "dopt/distributed/comm_hooks.hpp"
#include "dopt/distributed/internal/device_ops.hpp"
#include "dopt/distributed/post_local_sgd.hpp"
#include "dopt/distributed/reducer.hpp"
#include "dopt/optim/sgd.hpp"
#include "gpu_checks.hpp"

using namespace dopt;
using namespace dopt::optim;

namespace {

// The CPU path's bits, a NaN matching any NaN (CUDA returns the canonical NaN
// where x86 keeps sign and payload: the NaN contract in docs/gpu.md).
bool bitwise(const Tensor& a, const Tensor& b) { return testing::same_bits_nan_as_class(a, b); }

// |a - b| <= rel * max(1, max |b|) (for NCCL's summation order with > 2 ranks).
bool close(const Tensor& a, const Tensor& b, double rel) {
  double scale = 1.0;
  for (double x : b.to_vector<double>()) scale = std::max(scale, std::fabs(x));
  return a.max_abs_diff(b) <= rel * scale;
}

// exponents in [lo, hi]: with a narrow range two 16-bit values add exactly in float32,
// so NCCL's 16-bit sums and the CPU's (float32, rounded once) agree.
Tensor random_values(std::mt19937& rng, std::int64_t n, DType dt, int lo = -12, int hi = 6) {
  std::normal_distribution<double> nd(0.0, 1.0);
  std::uniform_int_distribution<int> ex(lo, hi);
  std::vector<double> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = std::ldexp(std::clamp(nd(rng), -1.9, 1.9), ex(rng));
  return Tensor::from_vector(v, {n}).to(dt);
}

using Failures = dopt::testing::RankLog;

}  // namespace

TEST_CASE("DDP device ops on CUDA: division and casts give the CPU path's bits (NaN as a class)", "[gpu][ddp]") {
  DOPT_REQUIRE_CUDA();
  std::vector<double> vals{0.0, -0.0, 1.0, -1.0, 65504.0, 65520.0, 1e-8, 3e-8, 6e-8, 1e-30, 1e300, -1e300, 3.4e38,
                           std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(),
                           std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::denorm_min()};
  std::mt19937 rng(3);
  std::normal_distribution<double> nd;
  for (int i = 0; i < 300000; ++i) vals.push_back(std::ldexp(nd(rng), static_cast<int>(rng() % 80) - 40));
  for (std::uint32_t h = 0; h < 65536; ++h) {
    vals.push_back(half_to_float(static_cast<std::uint16_t>(h)));
    vals.push_back(bfloat16_to_float(static_cast<std::uint16_t>(h)));
  }
  const Tensor base = Tensor::from_vector(vals);
  const Device dev = Device::cuda(0);
  const DType types[] = {DType::float32, DType::float64, DType::float16, DType::bfloat16};
  for (DType dt : types) {
    const Tensor src = base.to(dt);
    for (std::int64_t n : {1, 2, 3, 5, 7, 48}) {
      INFO(dtype_name(dt) << " / " << n);
      Tensor want = src.clone();
      optim::detail::divide_any_(want, n, "test");
      Tensor got = src.to(dev);
      optim::detail::divide_any_(got, n, "test");
      CHECK(bitwise(got, want));
    }
    for (DType to : types) {
      if (to == dt) continue;
      INFO(dtype_name(dt) << " -> " << dtype_name(to));
      Tensor want = Tensor::empty(src.shape(), to);
      want.copy_(src);
      const Tensor dsrc = src.to(dev);
      Tensor got = Tensor::empty(src.shape(), to, dev);
      optim::detail::convert_any_(got, dsrc);
      CHECK(bitwise(got, want));
    }
  }
}

TEST_CASE("Reducer on CUDA parameters with the built-in comm hooks gives the CPU gradients", "[gpu][ddp]") {
  DOPT_REQUIRE_CUDA();
  const int world = std::min(gpu::device_count(), 4);  // one rank per GPU
  const std::vector<std::int64_t> sizes{70000, 5, 1000, 33000, 1, 4097};
  const std::vector<DType> dtypes{DType::float32, DType::float32, DType::float64,
                                  DType::float32, DType::float32, DType::float64};
  for (int hook = 0; hook < 4; ++hook) {
    INFO("hook " << hook << " (allreduce, fp16, bf16, post_localSGD), world " << world);
    Failures failures;
    simulate(world, [&](RankContext& ctx) {
      ProcessGroup& w = ctx.world();
      const Device dev = Device::cuda(ctx.rank());
      std::mt19937 rng(100 + ctx.rank());
      std::vector<Tensor> cpu, gpu;
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        cpu.push_back(random_values(rng, sizes[i], dtypes[i]));
        gpu.push_back(cpu.back().to(dev));
      }
      ReducerOptions ro;
      ro.first_bucket_cap_bytes = 64 * 1024;
      ro.bucket_cap_bytes = 256 * 1024;
      Reducer rc(cpu, w, ro), rg(gpu, w, ro);
      auto make = [&]() -> CommHook {
        switch (hook) {
          case 0: return allreduce_hook(w);
          case 1: return fp16_compress_hook(w);
          case 2: return bf16_compress_hook(w);
          default: return post_localSGD_hook(std::make_shared<PostLocalSGDState>(w, ProcessGroup{}, 1));
        }
      };
      rc.register_comm_hook(make());
      rg.register_comm_hook(make());
      for (int it = 0; it < 3; ++it) {
        for (std::size_t i = 0; i < sizes.size(); ++i) {
          Tensor g = hook == 1 || hook == 2 ? random_values(rng, sizes[i], dtypes[i], -4, 4)
                                            : random_values(rng, sizes[i], dtypes[i]);
          cpu[i].set_grad(g);
          gpu[i].set_grad(g.to(dev));
        }
        for (std::size_t k = sizes.size(); k-- > 0;) {
          rc.mark_ready(cpu[k]);
          rg.mark_ready(gpu[k]);
        }
        rc.finalize();
        rg.finalize();
        for (std::size_t i = 0; i < sizes.size(); ++i) {
          const std::string where = "rank " + std::to_string(ctx.rank()) + " iteration " + std::to_string(it) +
                                    " grad " + std::to_string(i);
          if (!(gpu[i].grad().device() == dev)) failures.fail(where + " is not on " + dev.str());
          const bool ok = world <= 2 ? bitwise(gpu[i].grad(), cpu[i].grad())
                                     : close(gpu[i].grad(), cpu[i].grad(), hook == 1 || hook == 2 ? 1e-2 : 1e-6);
          if (!ok) failures.fail(where);
        }
      }
    });
    failures.report();
  }
}

TEST_CASE("PostLocalSGDOptimizer and average_parameters on CUDA parameters follow the CPU path", "[gpu][ddp]") {
  DOPT_REQUIRE_CUDA();
  const int world = std::min(gpu::device_count(), 4);
  Failures failures;
  simulate(world, [&](RankContext& ctx) {
    ProcessGroup& w = ctx.world();
    const Device dev = Device::cuda(ctx.rank());
    std::mt19937 rng(7 + ctx.rank());
    std::vector<Tensor> cpu, gpu;
    for (std::int64_t n : {50000, 3, 1000, 70001}) {
      cpu.push_back(random_values(rng, n, DType::float32));
      gpu.push_back(cpu.back().to(dev));
    }
    PostLocalSGDConfig cfg(w);
    cfg.start_localSGD_iter = 2;
    cfg.period = 2;
    const auto opts = SGDOptions(0.05).momentum(0.9).weight_decay(0.01);
    PostLocalSGDOptimizer oc(std::make_unique<SGD>(cpu, opts), cfg.make_averager());
    PostLocalSGDOptimizer og(std::make_unique<SGD>(gpu, opts), cfg.make_averager());
    for (int step = 0; step < 7; ++step) {
      for (std::size_t i = 0; i < cpu.size(); ++i) {
        Tensor g = random_values(rng, cpu[i].numel(), DType::float32);
        cpu[i].set_grad(g);
        gpu[i].set_grad(g.to(dev));
      }
      oc.step();
      og.step();
      for (std::size_t i = 0; i < cpu.size(); ++i) {
        const std::string where =
            "rank " + std::to_string(ctx.rank()) + " step " + std::to_string(step) + " parameter " + std::to_string(i);
        const bool ok = world <= 2 ? bitwise(gpu[i], cpu[i]) : close(gpu[i], cpu[i], 1e-5);
        if (!ok) failures.fail(where);
      }
    }
    // 16-bit parameters: average_parameters alone (the CPU optimizers reject them).
    for (DType dt : {DType::float16, DType::bfloat16}) {
      Tensor c = random_values(rng, 3000, dt, -4, 4), g = c.to(dev);
      average_parameters({c}, w);
      average_parameters({g}, w);
      const bool ok = world <= 2 ? bitwise(g, c) : close(g, c, 1e-2);
      if (!ok) failures.fail("rank " + std::to_string(ctx.rank()) + " average_parameters " + std::string(dtype_name(dt)));
    }
  });
  failures.report();
}
