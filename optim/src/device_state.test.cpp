// Device placement of optimizer state, without a GPU: the fake "CUDA" device
// of tests/support/fake_optim_device.hpp (host memory behind a fake
// allocator). load_state_dict puts state on the parameter's device, and keeps
// fp32 master weights and fp32 state of 16-bit parameters in fp32. (ZeRO's
// buffers on a device: distributed/src/zero/zero_device_state.test.cpp.)
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "dopt/optim/adam.hpp"
#include "dopt/optim/functional.hpp"
#include "fake_optim_device.hpp"

using namespace dopt;
using namespace dopt::optim;
using namespace dopt::testing;

TEST_CASE("load_state_dict puts state on the parameter's device", "[optim][device]") {
  FakeOptimDevice fake;
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
  FakeOptimDevice fake;
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
