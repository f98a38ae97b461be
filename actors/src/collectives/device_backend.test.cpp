// The device-backend hook of ProcessGroup: collectives on non-CPU tensors go
// to the registered backend (a fake here; gpu/ registers NCCL), CPU tensors
// and barrier stay on the rank actors, and without a backend a non-CPU
// tensor is a DeviceError. Runs without a GPU: the "CUDA" tensors are views
// of host memory that nothing dereferences.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <string>
#include <vector>

#include "dopt/actors/internal/device_backend.hpp"
#include "dopt/actors/simulate.hpp"

using namespace dopt;

namespace {

class FakeBackend final : public detail::DeviceBackend {
 public:
  Future<void> broadcast(ProcessGroup& g, const Tensor&, int src) override { return note(g, "broadcast", src); }
  Future<void> all_reduce(ProcessGroup& g, const Tensor&, ReduceOp op) override {
    return note(g, "all_reduce", static_cast<int>(op));
  }
  Future<void> reduce(ProcessGroup& g, const Tensor&, int dst, ReduceOp) override { return note(g, "reduce", dst); }
  Future<void> all_gather(ProcessGroup& g, const std::vector<Tensor>& outs, const Tensor&) override {
    return note(g, "all_gather", static_cast<int>(outs.size()));
  }
  Future<void> all_gather_into_tensor(ProcessGroup& g, const Tensor&, const Tensor&) override {
    return note(g, "all_gather_into_tensor", 0);
  }
  Future<void> reduce_scatter(ProcessGroup& g, const Tensor&, const std::vector<Tensor>& ins, ReduceOp) override {
    return note(g, "reduce_scatter", static_cast<int>(ins.size()));
  }
  Future<void> send(ProcessGroup& g, const Tensor&, int dst, int tag) override { return note(g, "send", dst * 100 + tag); }
  Future<void> recv(ProcessGroup& g, const Tensor&, int src, int tag) override { return note(g, "recv", src * 100 + tag); }

  std::vector<std::string> calls() {
    std::lock_guard<std::mutex> l(m_);
    return calls_;
  }

 private:
  Future<void> note(ProcessGroup& g, const char* what, int arg) {
    std::lock_guard<std::mutex> l(m_);
    calls_.push_back(std::to_string(g.rank()) + ":" + what + ":" + std::to_string(arg));
    return make_ready_future();
  }
  std::mutex m_;
  std::vector<std::string> calls_;
};

// A tensor that claims to live on cuda:0 (host memory underneath, never touched).
Tensor fake_cuda(std::vector<float>& host) {
  return Tensor::from_blob(host.data(), {static_cast<std::int64_t>(host.size())}, DType::float32, Device::cuda(0));
}

// Restores whatever backend was registered before (gpu::init() may have registered NCCL).
struct Restore {
  detail::DeviceBackend* previous;
  ~Restore() { detail::register_device_backend(DeviceType::CUDA, previous); }
};

}  // namespace

TEST_CASE("ProcessGroup hands collectives on CUDA tensors to the registered device backend", "[actors][device]") {
  std::vector<float> probe(1);
  Restore restore{detail::device_backend_for(fake_cuda(probe))};
  for (int world : {2, 3, 5}) {
    INFO("world " << world);
    FakeBackend fake;
    detail::register_device_backend(DeviceType::CUDA, &fake);
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
  Restore restore{detail::device_backend_for(fake_cuda(probe))};
  detail::register_device_backend(DeviceType::CUDA, nullptr);
  CHECK_THROWS_AS(detail::register_device_backend(DeviceType::CPU, nullptr), ValueError);
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
