#pragma once
// Test-only (distributed/src/*/*.test.cpp): a fake "CUDA" device for the
// device paths of distributed/ without a GPU. Host memory behind a fake
// allocator and CPU SGD on host views (fake DeviceStepper), both from
// fake_optim_device.hpp; collectives staged through the CPU
// rank actors (fake device plane) and the CPU arithmetic on host views
// (fake DeviceOps). FakeDevice registers them for DeviceType::CUDA and
// restores what was registered before (gpu::init() may have registered the
// real ones) when it goes away.
#include <catch2/catch.hpp>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "dopt/actors/internal/device_plane.hpp"
#include "dopt/actors/process_group.hpp"
#include "dopt/distributed/internal/device_ops.hpp"
#include "dopt/optim/internal/device_step.hpp"
#include "ddp/plsgd_util.hpp"
#include "fake_optim_device.hpp"  // kDev, host_view, FakeAllocator, FakeStepper

namespace dopt::testing {

// Collectives staged through the CPU rank actors (rank-order sums, like the
// CPU path): a device plane (dopt/actors/internal/device_plane.hpp) that runs
// broadcast and all_reduce on a CPU copy of the tensor and copies the result
// back. With check_calls, it first compares the calls across ranks
// (detail::check_calls_match), as the NCCL plane does under
// DOPT_NCCL_CHECK_CALLS=1.
class FakePlane final : public dopt::detail::GroupPlane {
 public:
  FakePlane(const ProcessGroup& group, std::atomic<long>& calls, bool check_calls)
      : group_(group), calls_(calls), check_calls_(check_calls) {}
  void run(const dopt::detail::OpPtr& op) override { run_async(op).get(); }
  Future<void> run_async(const dopt::detail::OpPtr& op) override {
    ++calls_;
    ProcessGroup cpu = group_.lock();
    try {
      if (check_calls_) dopt::detail::check_calls_match(cpu, *op);
    } catch (...) {
      return make_failed_future(std::current_exception());
    }
    const Tensor t = op->tensors[0];
    Tensor h = t.to(Device::cpu());
    Future<void> done = op->desc.kind == dopt::detail::CollKind::broadcast ? cpu.broadcast_async(h, op->desc.root)
                                                                           : cpu.all_reduce_async(h, op->desc.op);
    return done.then([t, h](Future<void> f) {
      f.get();
      t.copy_(h);
    });
  }
  /// Only broadcast and all_reduce: what the reducer and averagers use.
  bool supports(const dopt::detail::CollDesc& d) const override {
    return d.kind == dopt::detail::CollKind::broadcast || d.kind == dopt::detail::CollKind::all_reduce;
  }
  const char* name() const noexcept override { return "fake device"; }

 private:
  dopt::detail::WeakGroup group_;
  std::atomic<long>& calls_;
  bool check_calls_;
};

// Makes a FakePlane per group; counts the calls of all of them.
class FakePlanes final : public dopt::detail::DevicePlaneFactory {
 public:
  std::shared_ptr<dopt::detail::GroupPlane> make(const ProcessGroup& group, Device) override {
    return std::make_shared<FakePlane>(group, calls, check_calls);
  }
  std::atomic<long> calls{0};
  /// Planes made from now on compare their calls across ranks.
  bool check_calls = false;
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
  FakePlanes planes;
  FakeOps ops;
  FakeStepper stepper;
  Allocator* prev_alloc;
  dopt::detail::DevicePlaneFactory* prev_planes;
  optim::detail::DeviceOps* prev_ops;
  optim::detail::DeviceStepper* prev_stepper;
  explicit FakeDevice(bool with_ops) {
    std::vector<float> probe(1);
    Tensor p = Tensor::from_blob(probe.data(), {1}, DType::float32, kDev);
    prev_alloc = has_allocator(DeviceType::CUDA) ? &allocator_for(DeviceType::CUDA) : nullptr;
    prev_planes = dopt::detail::device_plane_factory(p);
    prev_ops = optim::detail::device_ops_for(p);
    prev_stepper = optim::detail::device_stepper_for(p);
    register_allocator(DeviceType::CUDA, &alloc);
    dopt::detail::register_device_plane(DeviceType::CUDA, &planes);
    optim::detail::register_device_ops(DeviceType::CUDA, with_ops ? &ops : nullptr);
    optim::detail::register_device_stepper(DeviceType::CUDA, &stepper);
  }
  ~FakeDevice() {
    register_allocator(DeviceType::CUDA, prev_alloc);
    dopt::detail::register_device_plane(DeviceType::CUDA, prev_planes);
    optim::detail::register_device_ops(DeviceType::CUDA, prev_ops);
    optim::detail::register_device_stepper(DeviceType::CUDA, prev_stepper);
  }
};

}  // namespace dopt::testing
