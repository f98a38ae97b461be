#pragma once
// Test-only (distributed/src/*/*.test.cpp): a fake "CUDA" device for the
// device paths of optim/ and distributed/ without a GPU. Host memory behind a
// fake allocator, collectives staged through the CPU rank actors (fake
// device backend), the CPU
// arithmetic on host views (fake DeviceOps) and CPU SGD on host views (fake
// DeviceStepper). FakeDevice registers them for DeviceType::CUDA and restores
// what was registered before (gpu::init() may have registered the real ones)
// when it goes away.
#include <catch2/catch.hpp>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "dopt/actors/device_backend.hpp"
#include "dopt/actors/process_group.hpp"
#include "dopt/distributed/device_ops.hpp"
#include "dopt/optim/device_step.hpp"
#include "dopt/optim/sgd.hpp"
#include "plsgd_util.hpp"

namespace dopt::optim::test {

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

// CPU SGD (no momentum: no state) over host views of the device parameters.
class FakeStepper final : public optim::detail::DeviceStepper {
 public:
  void step(const OptimizerOptions& options, const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
            const std::vector<ParamState*>&) override {
    const auto& o = dynamic_cast<const SGDOptions&>(options);
    REQUIRE(o.momentum() == 0.0);
    std::vector<Tensor> views;
    for (std::size_t i = 0; i < params.size(); ++i) {
      views.push_back(host_view(params[i]));
      views.back().set_grad(host_view(grads[i]));
    }
    SGD sgd(views, SGDOptions(o.get_lr()).weight_decay(o.weight_decay()));
    sgd.step();
    ++steps;
  }
  std::atomic<long> steps{0};
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

}  // namespace dopt::optim::test
