// TCP data plane on loopback: ring collectives over TcpMesh with 2 and 4 ranks as
// meshes in one process (one I/O thread each). JSON: --benchmark_format=json.
//
// Names: TcpAllReduce/<world>/<bytes>   float32 sum, <bytes> per rank (in place)
//        TcpAllGather/<world>/<bytes>   <bytes> input per rank (output world x bytes)
//        TcpBroadcast/<world>/<bytes>   from rank 0
//        TcpPingPong/2/<bytes>          one message there and back (latency)
// bytes_per_second = algbw (bytes / time per op); counter busbw = algbw x the
// nccl-tests bus factor (all_reduce 2(n-1)/n, all_gather (n-1)/n, broadcast 1).
#include <benchmark/benchmark.h>

#include <condition_variable>
#include <cstring>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dopt/actors/internal/ring.hpp"

using dopt::DType;
using dopt::ReduceOp;
using dopt::detail::RingGroup;
using dopt::transport::TcpListener;
using dopt::transport::TcpMesh;

namespace {

struct World {
  std::vector<std::unique_ptr<TcpMesh>> meshes;
  std::vector<RingGroup> groups;
};

World& world(int n) {
  static std::map<int, std::unique_ptr<World>> cache;
  auto& w = cache[n];
  if (!w) {
    w = std::make_unique<World>();
    std::vector<TcpListener> ls;
    std::vector<std::string> eps;
    for (int r = 0; r < n; ++r) {
      ls.push_back(TcpMesh::listen("127.0.0.1"));
      eps.push_back("127.0.0.1:" + std::to_string(ls.back().port()));
    }
    std::vector<std::future<std::unique_ptr<TcpMesh>>> fs;
    for (int r = 0; r < n; ++r)
      fs.push_back(std::async(std::launch::async, [&, r] {
        return std::make_unique<TcpMesh>(r, n, std::move(ls[r]), eps, std::chrono::seconds(30));
      }));
    std::vector<int> ranks;
    for (int r = 0; r < n; ++r) ranks.push_back(r);
    for (auto& f : fs) w->meshes.push_back(f.get());
    for (int r = 0; r < n; ++r) w->groups.push_back(RingGroup{w->meshes[r].get(), ranks, r});
  }
  return *w;
}

class Latch {
 public:
  explicit Latch(int n) : left_(n) {}
  dopt::detail::RingDone cb() {
    return [this](std::exception_ptr e) {
      std::lock_guard<std::mutex> l(m_);
      if (e && !error_) error_ = e;
      if (--left_ == 0) cv_.notify_all();
    };
  }
  void wait() {
    std::unique_lock<std::mutex> l(m_);
    cv_.wait(l, [&] { return left_ == 0; });
    if (error_) std::rethrow_exception(error_);
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  int left_;
  std::exception_ptr error_;
};

std::uint64_t next_id() {
  static std::uint64_t id = 1;
  return id++;
}

template <class Launch>
void run(benchmark::State& state, int n, std::size_t bytes, double bus_factor, Launch launch) {
  try {
    for (auto _ : state) {
      Latch latch(n);
      const std::uint64_t id = next_id();
      for (int r = 0; r < n; ++r) launch(r, id, latch.cb());
      latch.wait();
    }
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return;
  }
  state.SetBytesProcessed(std::int64_t(state.iterations()) * std::int64_t(bytes));
  state.counters["busbw"] = benchmark::Counter(double(state.iterations()) * double(bytes) * bus_factor,
                                               benchmark::Counter::kIsRate);
}

void TcpAllReduce(benchmark::State& state) {
  const int n = int(state.range(0));
  const std::size_t bytes = std::size_t(state.range(1));
  World& w = world(n);
  const std::int64_t numel = std::int64_t(bytes / 4);
  std::vector<std::vector<float>> buf(n, std::vector<float>(std::size_t(numel), 1.0f));
  run(state, n, bytes, 2.0 * (n - 1) / n, [&](int r, std::uint64_t id, dopt::detail::RingDone done) {
    dopt::detail::ring_all_reduce(w.groups[r], id, buf[r].data(), numel, DType::float32, ReduceOp::sum,
                                  std::move(done));
  });
}

void TcpAllGather(benchmark::State& state) {
  const int n = int(state.range(0));
  const std::size_t bytes = std::size_t(state.range(1));
  World& w = world(n);
  std::vector<std::vector<char>> in(n, std::vector<char>(bytes, 1)), out(n, std::vector<char>(bytes * n));
  run(state, n, bytes, double(n - 1) / n, [&](int r, std::uint64_t id, dopt::detail::RingDone done) {
    dopt::detail::ring_all_gather(w.groups[r], id, in[r].data(), bytes, out[r].data(), std::move(done));
  });
}

void TcpBroadcast(benchmark::State& state) {
  const int n = int(state.range(0));
  const std::size_t bytes = std::size_t(state.range(1));
  World& w = world(n);
  std::vector<std::vector<char>> buf(n, std::vector<char>(bytes, 1));
  run(state, n, bytes, 1.0, [&](int r, std::uint64_t id, dopt::detail::RingDone done) {
    dopt::detail::ring_broadcast(w.groups[r], id, buf[r].data(), bytes, 0, std::move(done));
  });
}

void TcpPingPong(benchmark::State& state) {
  const std::size_t bytes = std::size_t(state.range(1));
  World& w = world(2);
  std::vector<char> a(bytes, 1), b(bytes);
  for (auto _ : state) {
    std::promise<void> back;
    auto* m0 = w.meshes[0].get();
    auto* m1 = w.meshes[1].get();
    m1->recv(0, b.data(), bytes, [&, m1](std::exception_ptr) {
      m1->send(0, b.data(), bytes, [](std::exception_ptr) {});
    });
    m0->recv(1, a.data(), bytes, [&](std::exception_ptr) { back.set_value(); });
    m0->send(1, a.data(), bytes, [](std::exception_ptr) {});
    back.get_future().wait();
  }
  state.SetBytesProcessed(std::int64_t(state.iterations()) * std::int64_t(bytes) * 2);
}

void sizes(benchmark::internal::Benchmark* b) {
  for (int n : {2, 4})
    for (std::int64_t bytes : {std::int64_t(4) << 10, std::int64_t(64) << 10, std::int64_t(1) << 20,
                               std::int64_t(16) << 20, std::int64_t(64) << 20, std::int64_t(256) << 20})
      b->Args({n, bytes});
}

}  // namespace

BENCHMARK(TcpAllReduce)->Apply(sizes)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(TcpAllGather)->Apply(sizes)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(TcpBroadcast)->Apply(sizes)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(TcpPingPong)->Args({2, 8})->Args({2, 4096})->UseRealTime()->Unit(benchmark::kMicrosecond);

BENCHMARK_MAIN();
