#pragma once
// Test-only (distributed/src/*/*.test.cpp): a fake "CUDA" device for the
// device paths of distributed/ without a GPU. Host memory behind a fake
// allocator and CPU SGD on host views (fake DeviceStepper), both from
// fake_optim_device.hpp; collectives staged through the CPU
// rank actors (fake device backend) and the CPU arithmetic on host views
// (fake DeviceOps). FakeDevice registers them for DeviceType::CUDA and
// restores what was registered before (gpu::init() may have registered the
// real ones) when it goes away.
#include <catch2/catch.hpp>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "dopt/actors/internal/device_backend.hpp"
#include "dopt/actors/process_group.hpp"
#include "dopt/distributed/internal/device_ops.hpp"
#include "dopt/optim/internal/device_step.hpp"
#include "ddp/plsgd_util.hpp"
#include "fake_optim_device.hpp"  // kDev, host_view, FakeAllocator, FakeStepper

namespace dopt::testing {

// Collectives staged through the CPU rank actors (rank-order sums, like the CPU path).
class FakeBackend final : public dopt::detail::DeviceBackend {
 public:
  Future<void> broadcast(ProcessGroup& g, const Tensor& t, int src) override {
    return via_host(t, [&](const Tensor& h) { return g.broadcast_async(h, src); });
  }
  Future<void> all_reduce(ProcessGroup& g, const Tensor& t, ReduceOp op) override {
    return via_host(t, [&](const Tensor& h) { return g.all_reduce_async(h, op); });
  }
  Future<void> reduce(ProcessGroup&, const Tensor&, int, ReduceOp) override { return unsupported(); }
  Future<void> all_gather(ProcessGroup&, const std::vector<Tensor>&, const Tensor&) override { return unsupported(); }
  Future<void> all_gather_into_tensor(ProcessGroup&, const Tensor&, const Tensor&) override { return unsupported(); }
  Future<void> reduce_scatter(ProcessGroup&, const Tensor&, const std::vector<Tensor>&, ReduceOp) override {
    return unsupported();
  }
  Future<void> send(ProcessGroup&, const Tensor&, int, int) override { return unsupported(); }
  Future<void> recv(ProcessGroup&, const Tensor&, int, int) override { return unsupported(); }
  std::atomic<long> calls{0};

 private:
  // Runs the collective on a CPU copy of t, then copies the result back.
  template <class Collective>
  Future<void> via_host(const Tensor& t, Collective&& collective) {
    ++calls;
    Tensor h = t.to(Device::cpu());
    return collective(h).then([t, h](Future<void> f) {
      f.get();
      t.copy_(h);
    });
  }
  static Future<void> unsupported() {
    throw NotSupportedError("FakeBackend", "only broadcast and all_reduce are used by the reducer and averagers");
  }
};

class FakeOps final : public optim::detail::DeviceOps {
 public:
  void divide_(const Tensor& t, std::int64_t n) override {
    REQUIRE(t.device() == kDev);
    ++divides;
    optim::detail::divide_(host_view(t), n, "FakeOps");
  }
  void convert(const Tensor& dst, const Tensor& src) override {
    REQUIRE(dst.device() == kDev);
    REQUIRE(src.device() == kDev);
    REQUIRE(dst.dtype() != src.dtype());
    ++converts;
    host_view(dst).copy_(host_view(src));
  }
  std::atomic<long> divides{0}, converts{0};
};

// Registers the fakes for DeviceType::CUDA and restores what was there
// (gpu::init() may have registered the real ones) when it goes away.
struct FakeDevice {
  FakeAllocator alloc;
  FakeBackend backend;
  FakeOps ops;
  FakeStepper stepper;
  Allocator* prev_alloc;
  dopt::detail::DeviceBackend* prev_backend;
  optim::detail::DeviceOps* prev_ops;
  optim::detail::DeviceStepper* prev_stepper;
  explicit FakeDevice(bool with_ops) {
    std::vector<float> probe(1);
    Tensor p = Tensor::from_blob(probe.data(), {1}, DType::float32, kDev);
    prev_alloc = has_allocator(DeviceType::CUDA) ? &allocator_for(DeviceType::CUDA) : nullptr;
    prev_backend = dopt::detail::device_backend_for(p);
    prev_ops = optim::detail::device_ops_for(p);
    prev_stepper = optim::detail::device_stepper_for(p);
    register_allocator(DeviceType::CUDA, &alloc);
    dopt::detail::register_device_backend(DeviceType::CUDA, &backend);
    optim::detail::register_device_ops(DeviceType::CUDA, with_ops ? &ops : nullptr);
    optim::detail::register_device_stepper(DeviceType::CUDA, &stepper);
  }
  ~FakeDevice() {
    register_allocator(DeviceType::CUDA, prev_alloc);
    dopt::detail::register_device_backend(DeviceType::CUDA, prev_backend);
    optim::detail::register_device_ops(DeviceType::CUDA, prev_ops);
    optim::detail::register_device_stepper(DeviceType::CUDA, prev_stepper);
  }
};

}  // namespace dopt::testing
