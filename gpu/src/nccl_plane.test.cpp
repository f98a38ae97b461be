// The NCCL plane against the CPU planes: every collective kind, dtype and
// reduce op run through ProcessGroup on CUDA tensors (the NCCL plane) and on
// the same values on CPU tensors (the group's CPU plane), and the results
// compared; and, with DOPT_NCCL_CHECK_CALLS=1, a mismatched call raises
// CollectiveMismatchError on every rank as on the CPU planes. One rank per
// GPU; skipped without one (as gpu.test.cpp).
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "dopt/actors/simulate.hpp"
#include "dopt/gpu/device.hpp"
#include "gpu_checks.hpp"

using namespace dopt;

namespace {

const DType kDTypes[] = {DType::float32, DType::float64, DType::float16, DType::bfloat16, DType::int32, DType::int64};
const ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::product, ReduceOp::min, ReduceOp::max};

// Small integers (exact in every dtype, and in any summation order).
Tensor input(int r, std::int64_t n, DType dt, int salt) {
  std::vector<double> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = static_cast<double>((r * 3 + i + salt) % 5) - 2.0;
  return Tensor::from_vector(v).to(dt);
}

// Records a rank's findings; the test thread asserts after simulate().
struct Findings {
  std::mutex m;
  std::vector<std::string> failures;
  void check(bool ok, const std::string& what) {
    if (ok) return;
    std::lock_guard<std::mutex> l(m);
    failures.push_back(what);
  }
};

// Runs `call` on CUDA copies of `cpu` and on `cpu` itself, then compares.
template <class Call>
void same_on_both(Findings& f, const std::vector<Tensor>& cpu, const Device& dev, Call call, const std::string& what) {
  std::vector<Tensor> gpu;
  for (const auto& t : cpu) gpu.push_back(t.to(dev));
  call(gpu);
  call(cpu);
  for (std::size_t i = 0; i < cpu.size(); ++i)
    f.check(gpu[i].to(Device::cpu()).equal(cpu[i]), what + " tensor " + std::to_string(i));
}

}  // namespace

TEST_CASE("the NCCL plane gives the CPU planes' results for every collective, dtype and reduce op",
          "[gpu][nccl][planes]") {
  DOPT_REQUIRE_CUDA();
  const int world = std::min(gpu::device_count(), 4);  // one rank per GPU
  Findings f;
  simulate(world, [&](RankContext& ctx) {
    ProcessGroup& w = ctx.world();
    const int r = ctx.rank(), n = ctx.world_size();
    const Device dev = Device::cuda(r);
    for (DType dt : kDTypes) {
      const std::string in = " " + std::string(dtype_name(dt)) + " rank " + std::to_string(r);
      for (ReduceOp op : kOps) {
        if (op == ReduceOp::avg && !is_floating_point(dt)) continue;
        same_on_both(f, {input(r, 33, dt, 0)}, dev, [&](const std::vector<Tensor>& t) { w.all_reduce(t[0], op); },
                     "all_reduce " + std::string(reduce_op_name(op)) + in);
        same_on_both(f, {input(r, 9, dt, 1)}, dev, [&](const std::vector<Tensor>& t) { w.reduce(t[0], n - 1, op); },
                     "reduce " + std::string(reduce_op_name(op)) + in);
      }
      same_on_both(f, {input(r, 17, dt, 2)}, dev, [&](const std::vector<Tensor>& t) { w.broadcast(t[0], n - 1); },
                   "broadcast" + in);
      same_on_both(f, {input(r, 5, dt, 3), Tensor::zeros({5 * n}, dt)}, dev,
                   [&](const std::vector<Tensor>& t) { w.all_gather_into_tensor(t[1], t[0]); },
                   "all_gather_into_tensor" + in);
      std::vector<Tensor> gather{input(r, 4, dt, 4)}, scatter{Tensor::zeros({4}, dt)};
      for (int k = 0; k < n; ++k) {
        gather.push_back(Tensor::zeros({4}, dt));
        scatter.push_back(input(r, 4, dt, 5 + k));
      }
      same_on_both(f, gather, dev, [&](const std::vector<Tensor>& t) {
        w.all_gather({t.begin() + 1, t.end()}, t[0]);
      }, "all_gather" + in);
      same_on_both(f, scatter, dev, [&](const std::vector<Tensor>& t) {
        w.reduce_scatter(t[0], {t.begin() + 1, t.end()});
      }, "reduce_scatter" + in);
    }
  });
  for (const auto& x : f.failures) FAIL_CHECK(x);
  CHECK(f.failures.empty());
}

TEST_CASE("with DOPT_NCCL_CHECK_CALLS=1 a mismatched CUDA collective raises CollectiveMismatchError on every rank",
          "[gpu][nccl][planes]") {
  DOPT_REQUIRE_CUDA();
  if (gpu::device_count() < 2) {
    WARN("skipped: needs two CUDA devices");
    SUCCEED("skipped: needs two CUDA devices");
    return;
  }
  ::setenv("DOPT_NCCL_CHECK_CALLS", "1", 1);
  std::atomic<int> mismatches{0}, ok{0};
  simulate(2, [&](RankContext& ctx) {
    ProcessGroup& w = ctx.world();
    const Device dev = Device::cuda(ctx.rank());
    Tensor t = Tensor::full({8}, 1.0, DType::float32).to(dev);
    w.all_reduce(t);  // makes the plane (the check on), runs
    try {
      w.all_reduce(t, ctx.rank() == 0 ? ReduceOp::sum : ReduceOp::max);
    } catch (const CollectiveMismatchError&) {
      ++mismatches;
    }
    w.all_reduce(t);  // nothing was enqueued: the communicator goes on
    if (t.to(Device::cpu()).at(0) == 4.0) ++ok;
  });
  ::unsetenv("DOPT_NCCL_CHECK_CALLS");
  CHECK(mismatches == 2);
  CHECK(ok == 2);
}
