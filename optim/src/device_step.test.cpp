// The device-stepper hook: Optimizer::step, FunctionalOptimizer::step and
// step_param hand parameters on a device with a registered stepper to it
// (gpu/ registers the fused CUDA kernels), group by group, and keep CPU
// parameters on the CPU kernels. Runs without a GPU: the "CUDA" parameters
// are views of host memory that only the fake stepper sees, and SGD without
// momentum creates no state.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "dopt/optim/internal/device_step.hpp"
#include "dopt/optim/functional.hpp"
#include "dopt/optim/sgd.hpp"

using namespace dopt;
using namespace dopt::optim;

namespace {

struct FakeStepper final : detail::DeviceStepper {
  struct Call {
    double lr;
    std::vector<const TensorImpl*> params;
    std::size_t grads, states;
  };
  std::vector<Call> calls;
  void step(const OptimizerOptions& o, const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
            const std::vector<ParamState*>& states) override {
    Call c{o.get_lr(), {}, grads.size(), states.size()};
    for (const Tensor& p : params) c.params.push_back(p.key());
    for (ParamState* s : states) REQUIRE(s != nullptr);
    calls.push_back(c);
  }
};

struct Restore {
  detail::DeviceStepper* previous;
  ~Restore() { detail::register_device_stepper(DeviceType::CUDA, previous); }
};

Tensor fake_cuda(std::vector<float>& host) {
  return Tensor::from_blob(host.data(), {static_cast<std::int64_t>(host.size())}, DType::float32, Device::cuda(0));
}

}  // namespace

TEST_CASE("Optimizer::step hands device parameters to the registered stepper, group by group", "[optim][device]") {
  std::vector<float> probe(1), a(4), b(3), ga(4, 1.0f), gb(3, 1.0f);
  Restore restore{detail::device_stepper_for(fake_cuda(probe))};
  FakeStepper fake;
  detail::register_device_stepper(DeviceType::CUDA, &fake);
  Tensor pa = fake_cuda(a), pb = fake_cuda(b);
  pa.set_grad(fake_cuda(ga));
  pb.set_grad(fake_cuda(gb));
  Tensor host = Tensor::full({2}, 1.0);
  host.set_grad(Tensor::full({2}, 0.5));
  std::vector<OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<Tensor>{pa, host});
  groups.emplace_back(std::vector<Tensor>{pb}, SGDOptions(0.25));
  SGD opt(std::move(groups), SGDOptions(0.5));
  opt.step();
  REQUIRE(fake.calls.size() == 2);
  CHECK(fake.calls[0].lr == 0.5);
  CHECK(fake.calls[0].params == std::vector<const TensorImpl*>{pa.key()});
  CHECK(fake.calls[1].lr == 0.25);
  CHECK(fake.calls[1].params == std::vector<const TensorImpl*>{pb.key()});
  CHECK(host.at(0) == 0.75);  // the CPU parameter took the CPU kernel: 1 - 0.5 * 0.5
  CHECK(a[0] == 0.0f);        // the fake did not touch the device parameter's memory

  FunctionalSGD f({pa, host, pb}, SGDOptions(0.125));
  fake.calls.clear();
  f.step({fake_cuda(ga), Tensor::full({2}, 2.0), Tensor()});
  REQUIRE(fake.calls.size() == 1);
  CHECK(fake.calls[0].params == std::vector<const TensorImpl*>{pa.key()});
  CHECK(host.at(0) == 0.5);  // 0.75 - 0.125 * 2
  f.step_param(pb, fake_cuda(gb));
  REQUIRE(fake.calls.size() == 2);
  CHECK(fake.calls[1].params == std::vector<const TensorImpl*>{pb.key()});
}

TEST_CASE("without a device stepper, device parameters reach the CPU kernels' NotSupportedError", "[optim][device]") {
  std::vector<float> probe(1), a(4), ga(4, 1.0f);
  Restore restore{detail::device_stepper_for(fake_cuda(probe))};
  detail::register_device_stepper(DeviceType::CUDA, nullptr);
  CHECK_THROWS_AS(detail::register_device_stepper(DeviceType::CPU, nullptr), ValueError);
  Tensor pa = fake_cuda(a);
  pa.set_grad(fake_cuda(ga));
  SGD opt({pa}, SGDOptions(0.5));
  CHECK_THROWS_AS(opt.step(), NotSupportedError);
}
