// The Reducer (every built-in comm hook), average_parameters, the model
// averagers and PostLocalSGDOptimizer on device tensors, without a GPU: a
// fake "CUDA" device backed by host memory (allocator), a fake device
// plane (collectives staged through the CPU rank actors), fake DeviceOps
// (the CPU arithmetic on host views) and a fake DeviceStepper (CPU SGD on
// host views). The device path must give the CPU path's values bitwise at 2,
// 3 and 5 simulated ranks, with the ops registered (on-device arithmetic) and
// without (staged through host memory). The real kernels' arithmetic is
// checked against the CPU functions in gpu/src/ddp_ops.test.cpp (host build
// of the same code) and on a GPU in gpu/src/gpu_ddp.test.cpp.
#include <catch2/catch.hpp>

#include "rank_checks.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "dopt/actors/internal/device_plane.hpp"
#include "dopt/actors/simulate.hpp"
#include "dopt/distributed/averagers.hpp"
#include "dopt/distributed/comm_hooks.hpp"
#include "dopt/distributed/internal/device_ops.hpp"
#include "dopt/optim/internal/device_step.hpp"
#include "dopt/distributed/post_local_sgd.hpp"
#include "dopt/distributed/reducer.hpp"
#include "dopt/optim/sgd.hpp"
#include "fake_ddp_device.hpp"
#include "plsgd_util.hpp"

using namespace dopt;
using namespace dopt::optim;
using namespace dopt::testing;

namespace {

// Bitwise equality of two tensors' values (any devices).
bool bitwise(const Tensor& a, const Tensor& b) {
  if (a.numel() != b.numel() || a.dtype() != b.dtype()) return false;
  const Tensor ha = a.device().is_cpu() ? a : a.to(Device::cpu());
  const Tensor hb = b.device().is_cpu() ? b : b.to(Device::cpu());
  return a.numel() == 0 || std::memcmp(ha.data_ptr(), hb.data_ptr(), ha.nbytes()) == 0;
}

// Values of very different magnitudes (so that rounding in the division,
// the 16-bit casts and the sums matters), a few exact zeros and negatives.
Tensor random_values(std::mt19937& rng, std::int64_t n, DType dt) {
  std::normal_distribution<double> nd(0.0, 1.0);
  std::uniform_int_distribution<int> ex(-12, 6);
  std::vector<double> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = (rng() % 17 == 0) ? 0.0 : std::ldexp(nd(rng), ex(rng));
  return Tensor::from_vector(v, {n}).to(dt);
}

using Failures = dopt::testing::RankLog;

enum class Hook { allreduce, fp16, bf16, post_local };
const char* hook_name(Hook h) {
  switch (h) {
    case Hook::allreduce: return "allreduce_hook";
    case Hook::fp16: return "fp16_compress_hook";
    case Hook::bf16: return "bf16_compress_hook";
    case Hook::post_local: return "post_localSGD_hook";
  }
  return "?";
}

CommHook make_hook(Hook h, ProcessGroup& world) {
  switch (h) {
    case Hook::allreduce: return allreduce_hook(world);
    case Hook::fp16: return fp16_compress_hook(world);
    case Hook::bf16: return bf16_compress_hook(world);
    case Hook::post_local:
      return post_localSGD_hook(std::make_shared<PostLocalSGDState>(world, ProcessGroup{}, /*start=*/2));
  }
  return {};
}

// The CPU path's average for every group size: divide, then the CPU rank
// actors' SUM (what the device plane does here). On the CPU, 3 or more
// ranks of float32/float64 use gloo's ring order instead (averagers.hpp).
void reference_average(const std::vector<Tensor>& params, ProcessGroup& group) {
  for (const Tensor& p : params) {
    optim::detail::divide_(p, group.size(), "reference");
    group.all_reduce(p, ReduceOp::sum);
  }
}

}  // namespace

TEST_CASE("Reducer with every built-in comm hook on device tensors gives the CPU gradients bitwise",
          "[reducer][comm_hooks][device]") {
  const std::vector<std::int64_t> sizes{300, 5, 1000, 37, 1, 260};
  const std::vector<DType> dtypes{DType::float32, DType::float32, DType::float64,
                                  DType::float32, DType::float32, DType::float64};
  for (bool with_ops : {true, false}) {
    for (Hook hook : {Hook::allreduce, Hook::fp16, Hook::bf16, Hook::post_local}) {
      for (int world : {2, 3, 5}) {
        INFO(hook_name(hook) << ", world " << world << (with_ops ? ", device ops" : ", staged through host"));
        FakeDevice fake(with_ops);
        Failures failures;
        simulate(world, [&](RankContext& ctx) {
          ProcessGroup& w = ctx.world();
          std::mt19937 rng(1234 + ctx.rank());
          std::vector<Tensor> cpu, dev;
          for (std::size_t i = 0; i < sizes.size(); ++i) {
            cpu.push_back(random_values(rng, sizes[i], dtypes[i]));
            dev.push_back(cpu.back().to(kDev));
          }
          ReducerOptions ro;
          ro.first_bucket_cap_bytes = 1024;  // several buckets per dtype
          ro.bucket_cap_bytes = 4096;
          ro.find_unused_parameters = true;
          Reducer rc(cpu, w, ro), rd(dev, w, ro);
          REQUIRE(rd.num_buckets() >= 3);
          REQUIRE(rc.bucket_indices() == rd.bucket_indices());
          rc.register_comm_hook(make_hook(hook, w));
          rd.register_comm_hook(make_hook(hook, w));
          for (int it = 0; it < 4; ++it) {
            for (std::size_t i = 0; i < sizes.size(); ++i) {
              // Iteration 1 leaves parameter 3 unused (find_unused_parameters reduces zeros).
              if (it == 1 && i == 3) {
                cpu[i].set_grad(Tensor());
                dev[i].set_grad(Tensor());
                continue;
              }
              Tensor g = random_values(rng, sizes[i], dtypes[i]);
              cpu[i].set_grad(g);
              dev[i].set_grad(g.to(kDev));
            }
            for (std::size_t k = sizes.size(); k-- > 0;) {  // backward order
              if (it == 1 && k == 3) continue;
              rc.mark_ready(cpu[k]);
              rd.mark_ready(dev[k]);
            }
            rc.finalize();
            rd.finalize();
            for (std::size_t i = 0; i < sizes.size(); ++i) {
              if (dev[i].grad().device() != kDev)
                failures.fail("rank " + std::to_string(ctx.rank()) + " grad " + std::to_string(i) + " left the device");
              if (!bitwise(cpu[i].grad(), dev[i].grad()))
                failures.fail("rank " + std::to_string(ctx.rank()) + " iteration " + std::to_string(it) + " grad " +
                             std::to_string(i));
            }
          }
        });
        failures.report();
        CHECK(fake.planes.calls > 0);
        if (with_ops) {
          CHECK(fake.ops.divides > 0);
          if (hook == Hook::fp16 || hook == Hook::bf16) CHECK(fake.ops.converts > 0);
          else CHECK(fake.ops.converts == 0);
        } else {
          CHECK(fake.ops.divides == 0);
        }
      }
    }
  }
}

TEST_CASE("Reducer keeps its buckets on the parameters' device and refuses mixed devices", "[reducer][device]") {
  FakeDevice fake(true);
  simulate(2, [&](RankContext& ctx) {
    std::vector<Tensor> ps{Tensor::zeros({3}, DType::float32, kDev), Tensor::zeros({2})};
    CHECK_THROWS_AS(Reducer(ps, ctx.world()), ValueError);
    std::vector<Tensor> ok{Tensor::full({3}, 1.0 + ctx.rank(), DType::float32, kDev)};
    Reducer r(ok, ctx.world());  // broadcasts from rank 0 through the device plane
    CHECK(bitwise(ok[0], Tensor::full({3}, 1.0)));
    r.mark_ready(ok[0]);  // no gradient: zeros
    r.finalize();
    REQUIRE(ok[0].grad().defined());
    CHECK(ok[0].grad().device() == kDev);
    CHECK(bitwise(ok[0].grad(), Tensor::zeros({3})));
  });
  CHECK(fake.ops.divides > 0);
}

TEST_CASE("average_parameters on device tensors gives the CPU path's values bitwise", "[averagers][device]") {
  const std::vector<std::int64_t> sizes{200, 7, 1, 513, 64};
  const std::vector<DType> dtypes{DType::float32, DType::float16, DType::bfloat16, DType::float64, DType::float32};
  for (bool with_ops : {true, false}) {
    for (int world : {2, 3, 5}) {
      INFO("world " << world << (with_ops ? ", device ops" : ", staged through host"));
      FakeDevice fake(with_ops);
      Failures failures;
      simulate(world, [&](RankContext& ctx) {
        ProcessGroup& w = ctx.world();
        std::mt19937 rng(77 + ctx.rank());
        std::vector<Tensor> cpu, dev, ref;
        for (std::size_t i = 0; i < sizes.size(); ++i) {
          cpu.push_back(random_values(rng, sizes[i], dtypes[i]));
          dev.push_back(cpu.back().to(kDev));
          ref.push_back(cpu.back().clone());
        }
        average_parameters(cpu, w);
        average_parameters(dev, w);
        reference_average(ref, w);
        for (std::size_t i = 0; i < sizes.size(); ++i) {
          const std::string where = "rank " + std::to_string(ctx.rank()) + " parameter " + std::to_string(i);
          if (!bitwise(dev[i], ref[i])) failures.fail(where + ": device != divide + SUM");
          // The CPU path itself: the same bits, except gloo's ring order for >= 3 ranks of float32/float64.
          const bool ring = world >= 3 && (dtypes[i] == DType::float32 || dtypes[i] == DType::float64);
          if (!ring && !bitwise(dev[i], cpu[i])) failures.fail(where + ": device != CPU average_parameters");
          if (ring) {
            double scale = 1.0;
            for (double x : cpu[i].to_vector<double>()) scale = std::max(scale, std::fabs(x));
            if (dev[i].max_abs_diff(cpu[i]) > 1e-6 * scale) failures.fail(where + ": device far from the ring sum");
          }
        }
      });
      failures.report();
      if (with_ops) CHECK(fake.ops.divides == world * 4);  // one flat buffer per dtype
    }
  }
}

TEST_CASE("Periodic and hierarchical model averagers on device tensors follow the CPU schedule bitwise",
          "[averagers][device]") {
  for (int world : {2, 3, 5}) {
    INFO("world " << world);
    FakeDevice fake(true);
    Failures failures;
    simulate(world, [&](RankContext& ctx) {
      ProcessGroup& w = ctx.world();
      std::mt19937 rng(5 + ctx.rank());
      std::vector<Tensor> dev, ref;
      for (std::int64_t n : {33, 400}) {
        Tensor p = random_values(rng, n, DType::float32);
        p.set_grad(Tensor::zeros({n}));
        ref.push_back(p);
        dev.push_back(p.to(kDev));
        dev.back().set_grad(Tensor::zeros({n}, DType::float32, kDev));
      }
      Tensor no_grad = Tensor::full({4}, 1.0 + ctx.rank(), DType::float32, kDev);  // filtered out
      dev.push_back(no_grad);
      PeriodicModelAverager periodic(/*period=*/2, /*warmup_steps=*/1, w);
      HierarchicalModelAverager hier({{1, 1}, {3, world}}, /*warmup_steps=*/0, w);
      for (int step = 0; step < 6; ++step) {
        for (auto& p : ref) {
          float* d = p.data<float>();
          for (std::int64_t k = 0; k < p.numel(); ++k) d[k] += 0.125f * static_cast<float>(ctx.rank() + 1);
        }
        for (std::size_t i = 0; i < ref.size(); ++i) dev[i].copy_(ref[i]);
        periodic.average_parameters(dev);
        if (step >= 1 && (step - 1) % 2 == 0) reference_average(ref, w);
        hier.average_parameters(dev);
        if (step % 3 == 0) reference_average(ref, w);
        for (std::size_t i = 0; i < ref.size(); ++i)
          if (!bitwise(dev[i], ref[i]))
            failures.fail("rank " + std::to_string(ctx.rank()) + " step " + std::to_string(step) + " parameter " +
                         std::to_string(i));
        if (!bitwise(no_grad, Tensor::full({4}, 1.0 + ctx.rank())))
          failures.fail("a parameter without a gradient was averaged");
      }
    });
    failures.report();
  }
}

TEST_CASE("PostLocalSGDOptimizer on device parameters: device step, then the averager, as on the CPU",
          "[post_local_sgd][device]") {
  for (int world : {2, 3, 5}) {
    INFO("world " << world);
    FakeDevice fake(true);
    Failures failures;
    simulate(world, [&](RankContext& ctx) {
      ProcessGroup& w = ctx.world();
      std::mt19937 rng(99 + ctx.rank());
      std::vector<Tensor> cpu, dev, ref;
      for (std::int64_t n : {129, 3, 1000}) {
        cpu.push_back(random_values(rng, n, DType::float32));
        dev.push_back(cpu.back().to(kDev));
        ref.push_back(cpu.back().clone());
      }
      PostLocalSGDConfig cfg(w);
      cfg.start_localSGD_iter = 2;
      cfg.period = 2;
      PostLocalSGDOptimizer oc(std::make_unique<SGD>(cpu, SGDOptions(0.1).weight_decay(0.01)), cfg.make_averager());
      PostLocalSGDOptimizer od(std::make_unique<SGD>(dev, SGDOptions(0.1).weight_decay(0.01)), cfg.make_averager());
      SGD local(ref, SGDOptions(0.1).weight_decay(0.01));
      for (int step = 0; step < 7; ++step) {
        for (std::size_t i = 0; i < cpu.size(); ++i) {
          Tensor g = random_values(rng, cpu[i].numel(), DType::float32);
          cpu[i].set_grad(g);
          ref[i].set_grad(g.clone());
          dev[i].set_grad(g.to(kDev));
        }
        oc.step();
        od.step();
        local.step();
        if (step >= 2 && (step - 2) % 2 == 0) reference_average(ref, w);
        for (std::size_t i = 0; i < cpu.size(); ++i) {
          const std::string where =
              "rank " + std::to_string(ctx.rank()) + " step " + std::to_string(step) + " parameter " + std::to_string(i);
          if (!bitwise(dev[i], ref[i])) failures.fail(where + ": device != local step + divide + SUM");
          if (world == 2 && !bitwise(dev[i], cpu[i])) failures.fail(where + ": device != CPU PostLocalSGDOptimizer");
        }
      }
      if (od.averager().step() != oc.averager().step()) failures.fail("averager steps differ");
    });
    failures.report();
    CHECK(fake.stepper.steps == world * 7);
  }
}

TEST_CASE("the fake device plane with its calls compared finds a mismatch on every rank", "[reducer][device]") {
  FakeDevice fake(true);
  fake.planes.check_calls = true;
  std::atomic<int> mismatches{0}, sums_ok{0};
  simulate(3, [&](RankContext& ctx) {
    ProcessGroup& w = ctx.world();
    Tensor t = Tensor::full({4}, 1.0, DType::float32, kDev);
    try {
      w.all_reduce(t, ctx.rank() == 2 ? ReduceOp::max : ReduceOp::sum);
    } catch (const CollectiveMismatchError&) {
      ++mismatches;
    }
    w.all_reduce(t);  // nothing ran: every rank still has its ones
    if (bitwise(t, Tensor::full({4}, 3.0))) ++sums_ok;
  });
  CHECK(mismatches == 3);
  CHECK(sums_ok == 3);
}
