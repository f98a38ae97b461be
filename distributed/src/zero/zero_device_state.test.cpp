// Device placement of ZeRO's buffers, without a GPU: the fake "CUDA" device
// of fake_ddp_device.hpp (host memory behind a fake allocator). ZeRO with
// overlap_with_ddp keeps its bucket buffers, and so the parameters that
// become views of them, on the parameters' device, and steps them there (the
// GPU test "ZeRO overlap on CUDA parameters" in gpu/src/gpu.test.cpp runs the
// same on a GPU). (load_state_dict's placement of state:
// optim/src/device_state.test.cpp.)
#include <catch2/catch.hpp>

#include "rank_checks.hpp"

#include <cmath>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "dopt/actors/simulate.hpp"
#include "dopt/optim/adam.hpp"
#include "dopt/distributed/comm_hooks.hpp"
#include "dopt/optim/functional.hpp"
#include "dopt/distributed/reducer.hpp"
#include "dopt/distributed/zero.hpp"
#include "dopt/distributed/zero_overlap.hpp"
#include "fake_ddp_device.hpp"

using namespace dopt;
using namespace dopt::optim;
using namespace dopt::testing;

namespace {

bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.numel() != b.numel() || a.dtype() != b.dtype()) return false;
  const Tensor ha = a.device().is_cpu() ? a : a.to(Device::cpu());
  const Tensor hb = b.device().is_cpu() ? b : b.to(Device::cpu());
  return a.numel() == 0 || std::memcmp(ha.data_ptr(), hb.data_ptr(), ha.nbytes()) == 0;
}

Tensor values(std::int64_t n, int seed) {
  std::vector<double> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = ((i * 7 + seed * 13) % 23 - 11) / 16.0;
  return Tensor::from_vector(v);
}

using Failures = dopt::testing::RankLog;

}  // namespace

TEST_CASE("ZeRO overlap keeps device parameters and its buckets on their device and steps them there",
          "[zero][overlap][device]") {
  for (int world : {2, 3}) {
    INFO("world " << world);
    FakeDevice fake(true);
    Failures failures;
    simulate(world, [&](RankContext& ctx) {
      const int r = ctx.rank();
      const std::vector<std::int64_t> sizes{5, 9, 3, 7, 4};
      std::vector<Tensor> cpu, dev;
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        cpu.push_back(values(sizes[i], static_cast<int>(i)));
        dev.push_back(cpu.back().to(kDev));
      }
      const OptimizerSpec spec{"SGD", {{"lr", 0.1}}};  // the fake stepper is SGD without momentum
      ZeroRedundancyOptimizer zc(cpu, spec, ZeroOptions{ctx.world(), false, true});
      ZeroRedundancyOptimizer zd(dev, spec, ZeroOptions{ctx.world(), false, true});
      const auto ro = ReducerOptions{.bucket_cap_bytes = 40, .first_bucket_cap_bytes = 24};
      Reducer rc(cpu, ctx.world(), ro), rd(dev, ctx.world(), ro);
      rc.register_comm_hook(hook_with_zero_step_interleaved(allreduce_hook(ctx.world()), rc, zc));
      rd.register_comm_hook(hook_with_zero_step_interleaved(allreduce_hook(ctx.world()), rd, zd));
      const std::string where = "rank " + std::to_string(r);
      for (std::size_t i = 0; i < dev.size(); ++i)
        if (dev[i].device() != kDev) failures.fail(where + ": parameter " + std::to_string(i) + " left the device");
      for (int t = 0; t < 3; ++t) {
        for (std::size_t k = sizes.size(); k-- > 0;) {
          Tensor g = values(sizes[k], 100 * t + 10 * r + static_cast<int>(k));
          cpu[k].set_grad(g);
          dev[k].set_grad(g.to(kDev));
          rc.mark_ready(cpu[k]);
          rd.mark_ready(dev[k]);
        }
        rc.finalize();
        rd.finalize();
        zc.step();
        zd.step();
        for (std::size_t i = 0; i < dev.size(); ++i) {
          const std::string what = where + " iteration " + std::to_string(t) + " parameter " + std::to_string(i);
          if (dev[i].device() != kDev) failures.fail(what + " is on " + dev[i].device().str());
          if (!same_bits(dev[i], cpu[i])) failures.fail(what + " differs from the CPU run");
        }
      }
      if (fake.stepper.steps == 0) failures.fail(where + ": the device stepper never ran");
    });
    failures.report();
  }
}
