// GPU tests of the stream, lifetime and state contracts (docs/gpu.md), each
// written against a defect it would have caught: ZeRO's overlap path on CUDA
// parameters, fused steps that span several launches and tensors of more
// than 2^31 elements, collective timeouts and aborts on one GPU, the
// timeout's start, state dicts of CUDA and 16-bit parameters, blocking calls
// inside continuations, producers on other streams, allocator reuse under
// queued work, one stream per communicator. Each test needs a CUDA device and
// reports itself skipped without one; the host-side logic behind them is
// tested on every machine (gpu/src/host.test.cpp, optim/src/device_state.test.cpp,
// distributed/src/zero/zero_device_state.test.cpp).
#include <catch2/catch.hpp>

#include "rank_checks.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dopt/actors/simulate.hpp"
#include "dopt/gpu/device.hpp"
#include "dopt/gpu/fused.hpp"
#include "dopt/gpu/nccl.hpp"
#include "dopt/gpu/stream.hpp"
#include "dopt/optim/adam.hpp"
#include "dopt/distributed/comm_hooks.hpp"
#include "dopt/optim/functional.hpp"
#include "dopt/distributed/reducer.hpp"
#include "dopt/optim/sgd.hpp"
#include "dopt/distributed/zero.hpp"
#include "dopt/distributed/zero_overlap.hpp"
#include "gpu_checks.hpp"
#include "multi_tensor.hpp"
#include "test_kernels.hpp"

using namespace dopt;
using namespace dopt::optim;
using dopt::testing::same_bits_nan_as_class;
using Clock = std::chrono::steady_clock;

namespace {

using Failures = dopt::testing::RankLog;

// Deterministic float32 values in [-1, 1) (a hash of the index), on the CPU.
Tensor pattern(std::int64_t n, std::uint32_t seed) {
  Tensor t = Tensor::empty({n}, DType::float32);
  float* d = t.data<float>();
  for (std::int64_t i = 0; i < n; ++i) {
    std::uint32_t x = static_cast<std::uint32_t>(i) * 2654435761u ^ (seed * 40503u + 0x9e3779b9u);
    x ^= x >> 15;
    x *= 2246822519u;
    x ^= x >> 13;
    d[i] = static_cast<float>(x >> 8) / 8388608.0f - 1.0f;
  }
  return t;
}

// Small multiples of 2^-10: sums over any number of ranks are exact in any order.
Tensor exact_grad(std::int64_t n, int rank, int k, int step) {
  Tensor g = Tensor::empty({n});
  float* d = g.data<float>();
  for (std::int64_t i = 0; i < n; ++i) d[i] = static_cast<float>((rank + 1) * ((i % 7) - 3 + k + step)) / 1024.0f;
  return g;
}

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

}  // namespace

TEST_CASE("ZeRO overlap on CUDA parameters: buckets stay on the device and match the CPU run", "[gpu][zero]") {
  DOPT_REQUIRE_CUDA();
  const int world = std::min(gpu::device_count(), 4);  // one rank per GPU
  Failures failures;
  simulate(world, [&](RankContext& ctx) {
    const int r = ctx.rank();
    const Device dev = Device::cuda(r);
    const std::vector<std::int64_t> sizes{70000, 5, 1000, 33000, 1};
    std::vector<Tensor> cpu, gpu;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      cpu.push_back(pattern(sizes[i], static_cast<std::uint32_t>(i)));
      gpu.push_back(cpu.back().to(dev));
    }
    const OptimizerSpec spec{"Adam", {{"lr", 1e-2}, {"weight_decay", 1e-2}}};
    ZeroRedundancyOptimizer zc(cpu, spec, ZeroOptions{ctx.world(), false, true});
    ZeroRedundancyOptimizer zg(gpu, spec, ZeroOptions{ctx.world(), false, true});
    const auto ro = ReducerOptions{.bucket_cap_bytes = 128 * 1024, .first_bucket_cap_bytes = 64 * 1024};
    Reducer rc(cpu, ctx.world(), ro), rg(gpu, ctx.world(), ro);
    rc.register_comm_hook(hook_with_zero_step_interleaved(allreduce_hook(ctx.world()), rc, zc));
    rg.register_comm_hook(hook_with_zero_step_interleaved(allreduce_hook(ctx.world()), rg, zg));
    for (int t = 0; t < 3; ++t) {
      for (std::size_t k = sizes.size(); k-- > 0;) {
        Tensor g = exact_grad(sizes[k], r, static_cast<int>(k), t);
        cpu[k].set_grad(g);
        gpu[k].set_grad(g.to(dev));
        rc.mark_ready(cpu[k]);
        rg.mark_ready(gpu[k]);
      }
      rc.finalize();
      rg.finalize();
      zc.step();
      zg.step();  // before the fix: the parameters had moved to host memory and this threw
      for (std::size_t i = 0; i < gpu.size(); ++i) {
        const std::string what = "rank " + std::to_string(r) + " step " + std::to_string(t) + " parameter " +
                                 std::to_string(i);
        if (gpu[i].device() != dev) failures.fail(what + " is on " + gpu[i].device().str());
        else if (!same_bits_nan_as_class(gpu[i], cpu[i])) failures.fail(what + " differs from the CPU run");
      }
    }
  });
  failures.report();
}

TEST_CASE("a fused step of one tensor split across several launches matches the CPU path", "[gpu][fused]") {
  DOPT_REQUIRE_CUDA();
  // More chunks than one launch takes, plus a partial chunk.
  const std::int64_t n = static_cast<std::int64_t>(gpu::detail::kMaxBlocks) * gpu::detail::kChunk * 2 + 12345;
  REQUIRE(gpu::detail::plan_multi_tensor({n}).size() >= 3);
  Tensor cpu = pattern(n, 1);
  Tensor dev = cpu.to(Device::cuda(0));
  FunctionalAdam c(std::vector<Tensor>{cpu}, AdamOptions(1e-3).weight_decay(1e-2));
  FunctionalAdam g(std::vector<Tensor>{dev}, AdamOptions(1e-3).weight_decay(1e-2));
  gpu::Stream& s = gpu::current_stream(0);
  for (int step = 0; step < 2; ++step) {
    Tensor grad = pattern(n, 10 + static_cast<std::uint32_t>(step));
    c.step({grad});
    gpu::fused_step(g, {grad.to(Device::cuda(0))}, s);
  }
  s.synchronize();
  CHECK(same_bits_nan_as_class(dev, cpu));
  // The last chunk (in the last launch) was written.
  CHECK(dev.flat_slice(n - 100, 100).to(Device::cpu()).equal(cpu.flat_slice(n - 100, 100)));
  for (const char* key : {"exp_avg", "exp_avg_sq"}) {
    INFO(key);
    CHECK(same_bits_nan_as_class(g.state_of(dev)->at(key), c.state_of(cpu)->at(key)));
  }
  gpu::empty_cache();
}

TEST_CASE("SGD on a tensor of more than 2^31 elements updates every element up to the last", "[gpu][fused][large]") {
  DOPT_REQUIRE_CUDA();
  const std::int64_t n = (std::int64_t{1} << 31) + 4097;
  const Device d = Device::cuda(0);
  gpu::Stream& s = gpu::current_stream(0);
  Tensor p = Tensor::empty({n}, DType::float32, d);
  Tensor g = Tensor::empty({n}, DType::float32, d);
  gpu::detail::launch_delay_then_fill(s.native(), p.data<float>(), n, 1.0f, 0);
  gpu::detail::launch_delay_then_fill(s.native(), g.data<float>(), n, 0.5f, 0);
  s.synchronize();
  // Distinct values at the start, around 2^31 and at the end.
  const std::vector<std::int64_t> at{0, (std::int64_t{1} << 31) - 4, n - 8};
  for (std::int64_t o : at) {
    std::vector<float> pv(8), gv(8);
    for (int k = 0; k < 8; ++k) {
      pv[static_cast<std::size_t>(k)] = static_cast<float>(o % 1000 + k);
      gv[static_cast<std::size_t>(k)] = static_cast<float>(2 * k + 1);
    }
    p.flat_slice(o, 8).copy_(Tensor::from_vector(pv));
    g.flat_slice(o, 8).copy_(Tensor::from_vector(gv));
  }
  ParamState st;
  gpu::fused_step(SGDOptions(0.25), {p}, {g}, {&st}, s);
  s.synchronize();
  for (std::int64_t o : at) {
    const auto got = p.flat_slice(o, 8).to(Device::cpu()).to_vector<float>();
    for (int k = 0; k < 8; ++k) {
      INFO("element " << o + k);
      CHECK(got[static_cast<std::size_t>(k)] == static_cast<float>(o % 1000 + k) - 0.25f * static_cast<float>(2 * k + 1));
    }
  }
  // Everything else: 1 - 0.25 * 0.5, including the elements just past 2^31 and just before the end.
  for (std::int64_t o : {std::int64_t{8}, (std::int64_t{1} << 31) + 4, n - 4096}) {
    const auto got = p.flat_slice(o, 64).to(Device::cpu()).to_vector<float>();
    std::size_t wrong = 0;
    for (float x : got) wrong += x != 0.875f;
    INFO("from element " << o);
    CHECK(wrong == 0);
  }
  p = Tensor();
  g = Tensor();
  gpu::empty_cache();
}

// [abort]: aborts a communicator while work is queued; the device check runs
// these in a process of their own, after the others (gpu/device_check/run.sh).
TEST_CASE("a collective whose input producer is late times out, aborts, and later calls fail with StateError",
          "[gpu][nccl][abort]") {
  DOPT_REQUIRE_CUDA();
  std::atomic<int> timed_out{0}, state_errors{0};
  std::atomic<long> elapsed_ms{0};
  simulate(1, [&](RankContext& ctx) {
    ProcessGroup& w = ctx.world();
    const Device dev = Device::cuda(0);
    Tensor t = Tensor::full({4096}, 1.0, DType::float32, dev);
    w.all_reduce(t);  // creates the communicator
    w.set_timeout(std::chrono::milliseconds(300));
    // The producer of t, on this thread's stream, takes 3 s.
    gpu::Stream& mine = gpu::current_stream(0);
    gpu::detail::launch_delay_then_fill(mine.native(), t.data<float>(), t.numel(), 2.0f, 3'000'000'000LL);
    const auto t0 = Clock::now();
    try {
      w.all_reduce(t);
    } catch (const TimeoutError&) {
      ++timed_out;
    }
    elapsed_ms = static_cast<long>(ms_since(t0));
    try {
      w.all_reduce(t);
    } catch (const StateError&) {
      ++state_errors;
    }
    mine.synchronize();
  });
  CHECK(timed_out == 1);
  CHECK(state_errors == 1);
  CHECK(elapsed_ms >= 250);
  CHECK(elapsed_ms < 2500);  // failed at the timeout, not after the producer
}

TEST_CASE("a collective's timeout does not count the time queued behind its communicator's earlier work",
          "[gpu][nccl]") {
  DOPT_REQUIRE_CUDA();
  std::atomic<int> ok{0};
  std::atomic<long> elapsed_ms{0};
  simulate(1, [&](RankContext& ctx) {
    ProcessGroup& w = ctx.world();
    Tensor t = Tensor::full({4096}, 1.0, DType::float32, Device::cuda(0));
    w.all_reduce(t);
    auto nccl = gpu::nccl_group_for(w, 0);
    Tensor scratch = Tensor::zeros({256}, DType::float32, Device::cuda(0));
    // Earlier work on the communicator's own stream: 1.5 s, five times the timeout.
    gpu::detail::launch_delay_then_fill(nccl->stream().native(), scratch.data<float>(), 256, 1.0f,
                                        1'500'000'000LL);
    w.set_timeout(std::chrono::milliseconds(300));
    const auto t0 = Clock::now();
    w.all_reduce(t);  // throws TimeoutError if the queued time counted
    elapsed_ms = static_cast<long>(ms_since(t0));
    if (t.to(Device::cpu()).at(0) == 1.0) ++ok;
  });
  CHECK(ok == 1);
  CHECK(elapsed_ms >= 1000);  // it did wait for the earlier work
}

TEST_CASE("state dicts of CUDA and 16-bit parameters with master weights round-trip on the device", "[gpu][fused]") {
  DOPT_REQUIRE_CUDA();
  const Device dev = Device::cuda(0);
  gpu::FusedOptions fo;
  fo.master_weights = true;
  gpu::Stream& s = gpu::current_stream(0);
  std::vector<Tensor> pa{pattern(5000, 1).to(dev), pattern(3000, 2).to(DType::bfloat16).to(dev),
                         pattern(700, 3).to(DType::float16).to(dev)};
  std::vector<Tensor> pb;
  for (const Tensor& p : pa) pb.push_back(p.clone());
  Adam a(pa, AdamOptions(1e-2).weight_decay(1e-2));
  auto set_grads = [&](std::vector<Tensor>& ps, int step) {
    for (std::size_t i = 0; i < ps.size(); ++i)
      ps[i].set_grad(pattern(ps[i].numel(), 50 + 10 * static_cast<std::uint32_t>(step) + static_cast<std::uint32_t>(i))
                         .to(ps[i].dtype())
                         .to(dev));
  };
  for (int step = 0; step < 2; ++step) {
    set_grads(pa, step);
    gpu::fused_step(a, s, fo);
  }
  s.synchronize();
  for (std::size_t i = 0; i < pa.size(); ++i) pb[i].copy_(pa[i]);
  Adam b(pb, AdamOptions(1e-2).weight_decay(1e-2));
  b.load_state_dict(a.state_dict());
  for (std::size_t i = 0; i < pb.size(); ++i) {
    INFO("parameter " << i);
    const ParamState& st = b.state().at(pb[i].key());
    CHECK(st.at("step").device().is_cpu());
    for (const char* key : {"exp_avg", "exp_avg_sq"}) {
      CHECK(st.at(key).device() == dev);
      CHECK(st.at(key).dtype() == DType::float32);  // fp32 state of 16-bit parameters stays fp32
    }
    if (i > 0) {
      REQUIRE(st.count("master_param"));
      CHECK(st.at("master_param").dtype() == DType::float32);
      CHECK(st.at("master_param").device() == dev);
    }
  }
  set_grads(pa, 2);
  set_grads(pb, 2);
  gpu::fused_step(a, s, fo);
  gpu::fused_step(b, s, fo);
  s.synchronize();
  for (std::size_t i = 0; i < pa.size(); ++i) {
    INFO("parameter " << i);
    CHECK(same_bits_nan_as_class(pb[i], pa[i]));
    for (const auto& [key, t] : a.state().at(pa[i].key())) {
      INFO("state " << key);
      if (key == "step") CHECK(b.state().at(pb[i].key()).at(key).item() == t.item());
      else CHECK(same_bits_nan_as_class(b.state().at(pb[i].key()).at(key), t));
    }
  }
  // The functional form: state loaded onto the device, where the fused step reads it.
  FunctionalAdam fa(std::vector<Tensor>{pattern(4000, 7).to(dev)}, AdamOptions(1e-3));
  Tensor g1 = pattern(4000, 8).to(dev), g2 = pattern(4000, 9).to(dev);
  gpu::fused_step(fa, {g1}, s);
  FunctionalAdam fb(std::vector<Tensor>{fa.params()[0].clone()}, AdamOptions(1e-3));
  s.synchronize();
  fb.params()[0].copy_(fa.params()[0]);
  fb.load_state_dict(fa.state_dict());
  CHECK(fb.state_of(fb.params()[0])->at("exp_avg").device() == dev);
  gpu::fused_step(fa, {g2}, s);
  gpu::fused_step(fb, {g2}, s);  // before the fix: DeviceError, the state was on the host
  s.synchronize();
  CHECK(same_bits_nan_as_class(fb.params()[0], fa.params()[0]));
}

TEST_CASE("Optimizer::step and a first collective inside a continuation complete", "[gpu][stream]") {
  DOPT_REQUIRE_CUDA();
  const Device dev = Device::cuda(0);
  std::vector<Tensor> cpu{pattern(10000, 1), pattern(333, 2)};
  std::vector<Tensor> gpu;
  for (const Tensor& p : cpu) gpu.push_back(p.to(dev));
  Adam oc(cpu, AdamOptions(1e-2)), og(gpu, AdamOptions(1e-2));
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    Tensor g = pattern(cpu[i].numel(), 20 + static_cast<std::uint32_t>(i));
    cpu[i].set_grad(g);
    gpu[i].set_grad(g.to(dev));
  }
  oc.step();
  auto s = gpu::make_stream(0);
  // Before the fix the step waited for a completion future that only the
  // thread running this continuation could fill: it never returned.
  Future<void> f = s->completion().then([&](Future<void> r) {
    r.get();
    og.step();
  });
  REQUIRE(f.wait_for(std::chrono::seconds(30)));
  CHECK_NOTHROW(f.get());
  for (std::size_t i = 0; i < cpu.size(); ++i) CHECK(same_bits_nan_as_class(gpu[i], cpu[i]));

  std::atomic<bool> value_ok{false};
  simulate(1, [&](RankContext& ctx) {
    ProcessGroup sub = ctx.world().new_group({0});  // no communicator yet: made inside the continuation
    Tensor x = Tensor::full({64}, 3.0, DType::float32, dev);
    auto t = gpu::make_stream(0);
    Future<void> h = t->completion().then([&](Future<void> r) {
      r.get();
      sub.all_reduce(x);  // blocking: NCCL set-up, then the collective's own completion
    });
    // Meanwhile other GPU futures are still delivered.
    auto u = gpu::make_stream(0);
    Future<void> other = u->completion();
    bool other_ok = other.wait_for(std::chrono::seconds(30));
    bool h_ok = h.wait_for(std::chrono::seconds(60));
    if (other_ok && h_ok) {
      h.get();
      value_ok = x.to(Device::cpu()).at(63) == 3.0;
    }
  });
  CHECK(value_ok);
}

TEST_CASE("a collective reads inputs that a producer on the caller's stream or another stream wrote", "[gpu][nccl]") {
  DOPT_REQUIRE_CUDA();
  std::atomic<int> good{0};
  simulate(1, [&](RankContext& ctx) {
    ProcessGroup& w = ctx.world();
    const Device dev = Device::cuda(0);
    const std::int64_t n = 1 << 20;
    Tensor t = Tensor::zeros({n}, DType::float32, dev);
    w.all_reduce(t);  // communicator made, before the producers
    // 1. The producer is this thread's current stream.
    gpu::detail::launch_delay_then_fill(gpu::current_stream(0).native(), t.data<float>(), n, 7.0f, 200'000'000);
    w.all_reduce(t);
    Tensor h = t.to(Device::cpu());
    if (h.at(0) == 7.0 && h.at(n - 1) == 7.0) ++good;
    // 2. Another actor's stream, made current with a StreamGuard.
    auto producer = gpu::make_stream(0);
    {
      gpu::StreamGuard guard(*producer);
      gpu::detail::launch_delay_then_fill(producer->native(), t.data<float>(), n, 9.0f, 200'000'000);
      w.all_reduce(t, ReduceOp::max);
    }
    h = t.to(Device::cpu());
    if (h.at(0) == 9.0 && h.at(n - 1) == 9.0) ++good;
    // 3. An all_gather_into_tensor (out of place) after a producer: the output holds the produced values.
    Tensor out = Tensor::zeros({n}, DType::float32, dev);
    gpu::detail::launch_delay_then_fill(gpu::current_stream(0).native(), t.data<float>(), n, 11.0f, 200'000'000);
    w.all_gather_into_tensor(out, t);
    h = out.to(Device::cpu());
    if (h.at(0) == 11.0 && h.at(n - 1) == 11.0) ++good;
  });
  CHECK(good == 3);
}

TEST_CASE("memory of a tensor re-pointed with set_data is not reused while queued work still uses it",
          "[gpu][stream]") {
  DOPT_REQUIRE_CUDA();
  const Device dev = Device::cuda(0);
  const std::int64_t n = (1 << 18) + 333;  // a size no other test allocates
  auto s = gpu::make_stream(0);
  Tensor src = Tensor::zeros({n}, DType::float32, dev);
  Tensor a = Tensor::zeros({n}, DType::float32, dev);
  gpu::detail::launch_delay_then_fill(s->native(), src.data<float>(), n, 5.0f, 300'000'000);
  s->copy_async(a, src);  // holds a's storage until the copy is done
  void* old = a.data_ptr();
  a.set_data(Tensor::zeros({n}, DType::float32, dev));  // like param.data = other
  Tensor c = Tensor::empty({n}, DType::float32, dev);    // the caching pool must not hand `old` out yet
  CHECK(c.data_ptr() != old);
  s->synchronize();
  // Once the copy is done the block goes back to the pool (released by the completion thread).
  bool reused = false;
  const auto until = Clock::now() + std::chrono::seconds(5);
  std::vector<Tensor> grabbed;
  while (!reused && Clock::now() < until) {
    grabbed.push_back(Tensor::empty({n}, DType::float32, dev));
    reused = grabbed.back().data_ptr() == old;
    if (!reused) {
      grabbed.pop_back();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  CHECK(reused);
}

TEST_CASE("each communicator has its own stream, two groups used in opposite orders by two threads do not deadlock",
          "[gpu][nccl]") {
  DOPT_REQUIRE_CUDA();
  std::atomic<int> distinct{0};
  simulate(1, [&](RankContext& ctx) {
    ProcessGroup other = ctx.world().new_group({0});
    Tensor t = Tensor::full({16}, 1.0, DType::float32, Device::cuda(0));
    ctx.world().all_reduce(t);
    other.all_reduce(t);
    auto a = gpu::nccl_group_for(ctx.world(), 0), b = gpu::nccl_group_for(other, 0);
    if (a->stream().native() != b->stream().native()) ++distinct;
  });
  CHECK(distinct == 1);
  if (gpu::device_count() < 2) {
    WARN("the cross-order part needs two CUDA devices");
    return;
  }
  // Rank 0 issues group A then B, rank 1 B then A, from two threads each. With
  // one stream per rank, A waited behind B on rank 1 and B behind A on rank 0.
  std::atomic<int> done{0};
  SimulateOptions so;
  so.timeout = std::chrono::seconds(20);
  simulate(2, [&](RankContext& ctx) {
    const Device dev = Device::cuda(ctx.rank());
    ProcessGroup ga = ctx.world().new_group({0, 1});
    ProcessGroup gb = ctx.world().new_group({0, 1});
    ga.set_timeout(std::chrono::seconds(10));
    gb.set_timeout(std::chrono::seconds(10));
    Tensor x = Tensor::full({1 << 20}, 1.0, DType::float32, dev), y = x.clone();
    ga.all_reduce(x);  // both communicators made, in the same order on both ranks
    gb.all_reduce(y);
    std::atomic<bool> first_issued{false}, failed{false};
    auto issue = [&](ProcessGroup& g, Tensor& z, bool first) {
      if (!first)
        while (!first_issued) std::this_thread::yield();
      try {
        Future<void> f = g.all_reduce_async(z);
        if (first) first_issued = true;
        f.get();
      } catch (...) {
        first_issued = true;
        failed = true;
      }
    };
    ProcessGroup& first = ctx.rank() == 0 ? ga : gb;
    ProcessGroup& second = ctx.rank() == 0 ? gb : ga;
    Tensor& fx = ctx.rank() == 0 ? x : y;
    Tensor& sx = ctx.rank() == 0 ? y : x;
    std::thread t1([&] { issue(first, fx, true); });
    std::thread t2([&] { issue(second, sx, false); });
    t1.join();
    t2.join();
    if (!failed) ++done;
  }, so);
  CHECK(done == 2);
}
