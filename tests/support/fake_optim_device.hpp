#pragma once
// Test-only: the single-rank part of a fake "CUDA" device, for the device
// paths of optim/ without a GPU (optim/src/device_state.test.cpp). Host
// memory behind a fake allocator and CPU SGD on host views (fake
// DeviceStepper). FakeOptimDevice registers them for DeviceType::CUDA and
// restores what was registered before (gpu::init() may have registered the
// real ones) when it goes away. fake_ddp_device.hpp adds the
// collectives and the DDP device ops (FakeDevice).
#include <catch2/catch.hpp>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "dopt/optim/internal/device_step.hpp"
#include "dopt/optim/sgd.hpp"

namespace dopt::testing {

// The fake device.
constexpr Device kDev = Device::cuda(0);

// A CPU view of a (fake) device tensor's bytes.
inline Tensor host_view(const Tensor& t) { return Tensor::from_blob(t.data_ptr(), t.shape(), t.dtype(), Device::cpu()); }

class FakeAllocator final : public Allocator {
 public:
  void* allocate(std::size_t nbytes, Device) override {
    ++live;
    return nbytes ? std::malloc(nbytes) : nullptr;
  }
  void deallocate(void* p, std::size_t, Device) noexcept override {
    --live;
    std::free(p);
  }
  void copy(void* dst, Device, const void* src, Device, std::size_t n) override {
    if (n) std::memmove(dst, src, n);
  }
  void memset_zero(void* p, Device, std::size_t n) override {
    if (n) std::memset(p, 0, n);
  }
  std::atomic<long> live{0};
};

// CPU SGD (no momentum: no state) over host views of the device parameters.
class FakeStepper final : public optim::detail::DeviceStepper {
 public:
  void step(const optim::OptimizerOptions& options, const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
            const std::vector<ParamState*>&) override {
    const auto& o = dynamic_cast<const optim::SGDOptions&>(options);
    REQUIRE(o.momentum() == 0.0);
    std::vector<Tensor> views;
    for (std::size_t i = 0; i < params.size(); ++i) {
      views.push_back(host_view(params[i]));
      views.back().set_grad(host_view(grads[i]));
    }
    optim::SGD sgd(views, optim::SGDOptions(o.get_lr()).weight_decay(o.weight_decay()));
    sgd.step();
    ++steps;
  }
  std::atomic<long> steps{0};
};

// Registers the fake allocator and stepper for DeviceType::CUDA and restores
// what was there when it goes away.
struct FakeOptimDevice {
  FakeAllocator alloc;
  FakeStepper stepper;
  Allocator* prev_alloc;
  optim::detail::DeviceStepper* prev_stepper;
  FakeOptimDevice() {
    std::vector<float> probe(1);
    Tensor p = Tensor::from_blob(probe.data(), {1}, DType::float32, kDev);
    prev_alloc = has_allocator(DeviceType::CUDA) ? &allocator_for(DeviceType::CUDA) : nullptr;
    prev_stepper = optim::detail::device_stepper_for(p);
    register_allocator(DeviceType::CUDA, &alloc);
    optim::detail::register_device_stepper(DeviceType::CUDA, &stepper);
  }
  ~FakeOptimDevice() {
    register_allocator(DeviceType::CUDA, prev_alloc);
    optim::detail::register_device_stepper(DeviceType::CUDA, prev_stepper);
  }
};

}  // namespace dopt::testing
