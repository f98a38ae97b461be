// Device placement of optimizer buffers and state, without a GPU: the fake
// "CUDA" device of fake_device.hpp (host memory behind a fake allocator).
//   * ZeRO with overlap_with_ddp keeps its bucket buffers, and so the
//     parameters that become views of them, on the parameters' device, and
//     steps them there (the GPU test "ZeRO overlap on CUDA parameters" in
//     gpu/src/gpu.test.cpp runs the same on a GPU).
//   * load_state_dict puts state on the parameter's device, and keeps fp32
//     master weights and fp32 state of 16-bit parameters in fp32.
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
#include "ddp/fake_device.hpp"

using namespace dopt;
using namespace dopt::optim;
using namespace dopt::optim::test;

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

using Failures = dopt_test::RankLog;

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

TEST_CASE("load_state_dict puts state on the parameter's device", "[optim][device]") {
  FakeDevice fake(true);
  Tensor p = Tensor::zeros({4}, DType::float32, kDev);
  StateDict sd = Adam(std::vector<Tensor>{Tensor::zeros({4})}, AdamOptions(0.01)).state_dict();
  REQUIRE(sd.param_groups.size() == 1);
  sd.state[0]["step"] = Tensor::scalar(3.0);
  sd.state[0]["exp_avg"] = Tensor::full({4}, 0.5);
  sd.state[0]["exp_avg_sq"] = Tensor::full({4}, 0.25, DType::float64);  // cast to the parameter's dtype
  SECTION("Optimizer") {
    Adam opt(std::vector<Tensor>{p}, AdamOptions(0.01));
    opt.load_state_dict(sd);
    const ParamState& st = opt.state().at(p.key());
    CHECK(st.at("step").device().is_cpu());
    CHECK(st.at("exp_avg").device() == kDev);
    CHECK(st.at("exp_avg_sq").device() == kDev);
    CHECK(st.at("exp_avg_sq").dtype() == DType::float32);
    CHECK(st.at("exp_avg").to(Device::cpu()).at(3) == 0.5);
  }
  SECTION("FunctionalOptimizer") {
    FunctionalAdam f(std::vector<Tensor>{p}, AdamOptions(0.01));
    f.load_state_dict(sd);
    const ParamState* st = f.state_of(p);
    REQUIRE(st);
    CHECK(st->at("step").device().is_cpu());
    CHECK(st->at("exp_avg").device() == kDev);
    CHECK(st->at("exp_avg_sq").device() == kDev);
    CHECK(st->at("exp_avg_sq").dtype() == DType::float32);
    CHECK(st->at("exp_avg_sq").to(Device::cpu()).at(0) == 0.25);
  }
}

TEST_CASE("load_state_dict keeps fp32 master weights and fp32 state of 16-bit parameters in fp32", "[optim][device]") {
  // On the (fake) device: 16-bit parameters in host memory are refused by the optimizers.
  FakeDevice fake(true);
  for (DType low : {DType::float16, DType::bfloat16}) {
    INFO(dtype_name(low));
    Tensor p = Tensor::zeros({3}, low).to(kDev);
    StateDict sd = Adam(std::vector<Tensor>{Tensor::zeros({3})}, AdamOptions(0.01)).state_dict();
    // 1 + 2^-20 is not representable in 16 bits: a cast would show.
    const double fine = 1.0 + std::ldexp(1.0, -20);
    sd.state[0]["step"] = Tensor::scalar(1.0);
    sd.state[0]["exp_avg"] = Tensor::full({3}, fine);                       // fp32 state: kept
    sd.state[0]["exp_avg_sq"] = Tensor::full({3}, 0.5, DType::float64);     // other floats: the parameter's dtype
    sd.state[0]["master_param"] = Tensor::full({3}, fine);                  // master weights: fp32
    auto check = [&](const ParamState& st) {
      CHECK(st.at("exp_avg").dtype() == DType::float32);
      CHECK(st.at("exp_avg").to(Device::cpu()).at(1) == static_cast<double>(static_cast<float>(fine)));
      CHECK(st.at("master_param").dtype() == DType::float32);
      CHECK(st.at("master_param").to(Device::cpu()).at(2) == static_cast<double>(static_cast<float>(fine)));
      CHECK(st.at("exp_avg_sq").dtype() == low);
    };
    Adam opt(std::vector<Tensor>{p}, AdamOptions(0.01));
    opt.load_state_dict(sd);
    check(opt.state().at(p.key()));
    FunctionalAdam f(std::vector<Tensor>{p}, AdamOptions(0.01));
    f.load_state_dict(sd);
    REQUIRE(f.state_of(p));
    check(*f.state_of(p));
    // And a round trip through state_dict() keeps them.
    Adam again(std::vector<Tensor>{p}, AdamOptions(0.01));
    again.load_state_dict(opt.state_dict());
    check(again.state().at(p.key()));
  }
}
