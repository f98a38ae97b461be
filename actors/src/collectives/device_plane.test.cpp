// The device planes of ProcessGroup: collectives on non-CPU tensors go to
// the plane that the device type's registered factory makes for the group (a
// fake here; gpu/ registers NCCL's), CPU tensors and barrier stay on the CPU
// plane, without a factory a non-CPU tensor is a DeviceError, and
// check_calls_match finds calls that differ across ranks. Runs without a
// GPU: the "CUDA" tensors are views of host memory that nothing dereferences.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <string>
#include <vector>

#include "dopt/actors/internal/device_plane.hpp"
#include "dopt/actors/simulate.hpp"

using namespace dopt;

namespace {

// Notes "rank:kind:arg" for every call it runs and completes it at once;
// with `check`, compares the calls across ranks first.
class RecordingPlane final : public detail::GroupPlane {
 public:
  struct Log {
    std::mutex m;
    std::vector<std::string> calls;
  };
  RecordingPlane(const ProcessGroup& group, Log& log, bool check) : group_(group), log_(log), check_(check) {}
  void run(const detail::OpPtr& op) override { run_async(op).get(); }
  Future<void> run_async(const detail::OpPtr& op) override {
    if (check_) {
      try {
        detail::check_calls_match(group_.lock(), *op);
      } catch (...) {
        return make_failed_future(std::current_exception());
      }
    }
    std::lock_guard<std::mutex> l(log_.m);
    log_.calls.push_back(std::to_string(op->my_grank) + ":" + detail::coll_name(op->desc.kind) + ":" +
                         std::to_string(arg(*op)));
    return make_ready_future();
  }
  bool supports(const detail::CollDesc& d) const override {
    return d.kind != detail::CollKind::all_reduce_coalesced && d.kind != detail::CollKind::broadcast_coalesced;
  }
  const char* name() const noexcept override { return "recording"; }

 private:
  static int arg(const detail::Op& op) {
    using detail::CollKind;
    const int per_rank = static_cast<int>(op.tensors.size()) - 1;
    switch (op.desc.kind) {
      case CollKind::all_reduce: return static_cast<int>(op.desc.op);
      case CollKind::all_gather:
      case CollKind::reduce_scatter: return per_rank;
      case CollKind::all_gather_flat: return 0;
      case CollKind::send:
      case CollKind::recv: return op.peer * 100 + op.tag;
      default: return op.desc.root;
    }
  }
  detail::WeakGroup group_;
  Log& log_;
  bool check_;
};

class RecordingFactory final : public detail::DevicePlaneFactory {
 public:
  explicit RecordingFactory(bool check = false) : check_(check) {}
  std::shared_ptr<detail::GroupPlane> make(const ProcessGroup& group, Device device) override {
    REQUIRE(device == Device::cuda(0));
    return std::make_shared<RecordingPlane>(group, log_, check_);
  }
  std::vector<std::string> calls() {
    std::lock_guard<std::mutex> l(log_.m);
    return log_.calls;
  }

 private:
  RecordingPlane::Log log_;
  bool check_;
};

// A tensor that claims to live on cuda:0 (host memory underneath, never touched).
Tensor fake_cuda(std::vector<float>& host) {
  return Tensor::from_blob(host.data(), {static_cast<std::int64_t>(host.size())}, DType::float32, Device::cuda(0));
}

// Restores whatever factory was registered before (gpu::init() may have registered NCCL's).
struct Restore {
  detail::DevicePlaneFactory* previous;
  ~Restore() { detail::register_device_plane(DeviceType::CUDA, previous); }
};

}  // namespace

TEST_CASE("ProcessGroup hands collectives on CUDA tensors to the registered device backend", "[actors][device]") {
  std::vector<float> probe(1);
  Restore restore{detail::device_plane_factory(fake_cuda(probe))};
  for (int world : {2, 3, 5}) {
    INFO("world " << world);
    RecordingFactory fake;
    detail::register_device_plane(DeviceType::CUDA, &fake);
    std::atomic<int> cpu_ok{0};
    simulate(world, [&](RankContext& ctx) {
      ProcessGroup& w = ctx.world();
      const int n = ctx.world_size();
      std::vector<float> a(4), b(4 * static_cast<std::size_t>(n));
      std::vector<std::vector<float>> parts(static_cast<std::size_t>(n), std::vector<float>(4));
      Tensor t = fake_cuda(a), flat = fake_cuda(b);
      std::vector<Tensor> list;
      for (auto& p : parts) list.push_back(fake_cuda(p));
      w.broadcast(t, n - 1);
      w.all_reduce(t, ReduceOp::max);
      w.reduce(t, 0);
      w.all_gather(list, t);
      w.all_gather_into_tensor(flat, t);
      w.reduce_scatter(t, list);
      if (ctx.rank() == 0) w.send(t, 1, 7);
      if (ctx.rank() == 1) w.recv(t, 0, 7);
      // CPU tensors and barrier still run on the rank actors.
      Tensor cpu = Tensor::full({3}, ctx.rank() + 1.0);
      w.all_reduce(cpu);
      w.barrier();
      if (cpu.at(0) == n * (n + 1) / 2.0) ++cpu_ok;
    });
    CHECK(cpu_ok == world);
    auto calls = fake.calls();
    for (int r = 0; r < world; ++r) {
      const std::string p = std::to_string(r) + ":";
      auto has = [&](const std::string& s) { return std::find(calls.begin(), calls.end(), p + s) != calls.end(); };
      CHECK(has("broadcast:" + std::to_string(world - 1)));
      CHECK(has("all_reduce:" + std::to_string(static_cast<int>(ReduceOp::max))));
      CHECK(has("reduce:0"));
      CHECK(has("all_gather:" + std::to_string(world)));
      CHECK(has("all_gather_into_tensor:0"));
      CHECK(has("reduce_scatter:" + std::to_string(world)));
    }
    CHECK(std::count(calls.begin(), calls.end(), "0:send:107") == 1);
    CHECK(std::count(calls.begin(), calls.end(), "1:recv:7") == 1);
    CHECK(calls.size() == static_cast<std::size_t>(6 * world + 2));
  }
}

TEST_CASE("without a device backend a CUDA tensor is a DeviceError", "[actors][device]") {
  std::vector<float> probe(1);
  Restore restore{detail::device_plane_factory(fake_cuda(probe))};
  detail::register_device_plane(DeviceType::CUDA, nullptr);
  CHECK_THROWS_AS(detail::register_device_plane(DeviceType::CPU, nullptr), ValueError);
  std::atomic<int> threw{0};
  simulate(1, [&](RankContext& ctx) {
    std::vector<float> a(4);
    try {
      ctx.world().all_reduce(fake_cuda(a));
    } catch (const DeviceError&) {
      ++threw;
    }
  });
  CHECK(threw == 1);
}

TEST_CASE("a device plane's calls that differ across ranks raise CollectiveMismatchError on every rank",
          "[actors][device]") {
  std::vector<float> probe(1);
  Restore restore{detail::device_plane_factory(fake_cuda(probe))};
  RecordingFactory fake(/*check=*/true);
  detail::register_device_plane(DeviceType::CUDA, &fake);
  std::atomic<int> mismatches{0}, matched{0};
  simulate(3, [&](RankContext& ctx) {
    ProcessGroup& w = ctx.world();
    std::vector<float> a(4), b(ctx.rank() == 2 ? 5 : 4);
    w.all_reduce(fake_cuda(a));  // the same on every rank: runs
    ++matched;
    try {
      if (ctx.rank() == 1) w.broadcast(fake_cuda(a), 0);
      else w.all_reduce(fake_cuda(b));  // rank 2: another shape
    } catch (const CollectiveMismatchError& e) {
      if (std::string(e.what()).find("collective mismatch") != std::string::npos) ++mismatches;
    }
    w.all_reduce(fake_cuda(a));  // nothing was enqueued: the group goes on
  });
  CHECK(matched == 3);
  CHECK(mismatches == 3);
  CHECK(fake.calls().size() == 3 * 2);
}

TEST_CASE("a collective's tensors on two devices are a DeviceError", "[actors][device]") {
  std::vector<float> probe(1);
  Restore restore{detail::device_plane_factory(fake_cuda(probe))};
  RecordingFactory fake;
  detail::register_device_plane(DeviceType::CUDA, &fake);
  std::atomic<int> threw{0};
  simulate(1, [&](RankContext& ctx) {
    std::vector<float> a(4);
    try {
      ctx.world().all_gather_into_tensor(Tensor::zeros({4}), fake_cuda(a));
    } catch (const DeviceError&) {
      ++threw;
    }
  });
  CHECK(threw == 1);
  CHECK(fake.calls().empty());
}
