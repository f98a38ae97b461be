// One rank of the real-process tests of the agreement on skipped steps and
// of sharded gradient clipping (tests/skip_multiprocess.test.cpp). Started
// by dopt-run; joins the world with dopt::init_process_group and runs one
// scenario:
//
//   dopt_skip_peer zero    ZeroRedundancyOptimizer(Adam) with GradScaler and
//                          clip_grad_norm(zero): 6 steps, an inf planted at
//                          step 2 on the last rank in a gradient it owns.
//                          Checks, against a local Adam this process runs on
//                          the same gradients (clipped locally, step 2
//                          skipped): every step's decision, the clip total
//                          (bitwise), the parameters (bitwise), the scale.
//   dopt_skip_peer plsgd   PostLocalSGDOptimizer(SGD momentum) with
//                          PeriodicModelAverager(2, 0) and GradScaler: 5
//                          steps, an inf at step 2 (an averaging step) on
//                          rank 1. Checks: every rank skipped step 2 only,
//                          the averager counted 5 steps, and after step 2 and
//                          step 4 every rank holds the same parameters (all
//                          gathered and compared bitwise).
//
// stdout: "ok R <checks>" on success, otherwise "error KIND: MESSAGE".
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "dopt/optim/adam.hpp"
#include "dopt/optim/clip_grad.hpp"
#include "dopt/optim/grad_scaler.hpp"
#include "dopt/distributed/post_local_sgd.hpp"
#include "dopt/optim/sgd.hpp"
#include "dopt/distributed/zero.hpp"
#include "peer_main.hpp"

namespace {

using dopt::ProcessGroup;
using dopt::Tensor;
using dopt::testing::Checker;
namespace optim = dopt::optim;

constexpr float kInf = std::numeric_limits<float>::infinity();

/// A deterministic value in [-1, 1) of (a, b, c).
float value(std::uint64_t a, std::uint64_t b, std::uint64_t c) {
  std::uint64_t x = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull) * 0xBF58476D1CE4E5B9ull ^ c * 0x94D049BB133111EBull;
  x ^= x >> 31;
  x *= 0xD6E8FEB86659FD93ull;
  x ^= x >> 32;
  return static_cast<float>(static_cast<double>(x >> 11) / 4503599627370496.0 - 1.0);
}

std::vector<Tensor> make_params(int n) {
  std::vector<Tensor> ps;
  for (int k = 0; k < n; ++k) {
    std::vector<float> v(static_cast<std::size_t>(5 + 3 * k));
    for (std::size_t e = 0; e < v.size(); ++e) v[e] = value(1, static_cast<std::uint64_t>(k), e);
    ps.push_back(Tensor::from_vector(v));
  }
  return ps;
}

/// Gradients of step t (rank r; r = -1: the same everywhere), times `scale` (a power of 2: exact).
void set_grads(const std::vector<Tensor>& ps, int t, int r, double scale) {
  for (std::size_t k = 0; k < ps.size(); ++k) {
    std::vector<float> v(static_cast<std::size_t>(ps[k].numel()));
    for (std::size_t e = 0; e < v.size(); ++e)
      v[e] = static_cast<float>(3.0 * value(100 + static_cast<std::uint64_t>(t), static_cast<std::uint64_t>(r + 1) * 64 + k, e) * scale);
    ps[k].set_grad(Tensor::from_vector(v));
  }
}

optim::GradScalerOptions scaler_options() {
  optim::GradScalerOptions o;
  o.init_scale = 1024.0;
  o.growth_interval = 2;
  return o;
}

void zero_scenario(ProcessGroup& world, Checker& c) {
  const int rank = world.rank(), n = world.size();
  auto ps = make_params(7);
  optim::ZeroOptions zo;
  zo.process_group = world;
  optim::ZeroRedundancyOptimizer zero(ps, optim::AdamOptions(0.02), zo);
  optim::GradScaler scaler(scaler_options());
  auto ref = make_params(7);
  optim::Adam ref_opt(ref, optim::AdamOptions(0.02));
  optim::GradScaler ref_scaler(scaler_options());  // the scale sequence, without agreement
  const int planted = n - 1;
  std::size_t owned = 0;
  while (zero.param_owners()[owned] != planted) ++owned;
  for (int t = 0; t < 6; ++t) {
    set_grads(ps, t, -1, scaler.get_scale());
    set_grads(ref, t, -1, 1.0);
    if (t == 2 && rank == planted) ps[owned].grad().data<float>()[1] = kInf;
    scaler.unscale_(zero);
    const double total = optim::clip_grad_norm(zero, 2.0);
    const bool stepped = scaler.step(zero);
    scaler.update();
    c.expect(stepped == (t != 2), "step " + std::to_string(t) + ": stepped " + std::to_string(stepped));
    if (t != 2) {
      const double want = optim::clip_grad_norm(ref, 2.0);
      c.expect(total == want, "step " + std::to_string(t) + ": clip total differs from the local one");
      ref_opt.step();
    }
    c.params(ps, ref, "after step " + std::to_string(t));
  }
  // 1024 -> x2 after steps 0,1 -> /2 at 2 -> x2 after 3,4 -> 5: one good step
  c.expect(scaler.get_scale() == 2048.0, "scale " + std::to_string(scaler.get_scale()));
}

void plsgd_scenario(ProcessGroup& world, Checker& c) {
  const int rank = world.rank(), n = world.size();
  auto ps = make_params(4);
  optim::PostLocalSGDOptimizer opt(std::make_unique<optim::SGD>(ps, optim::SGDOptions(0.05).momentum(0.5)),
                                   std::make_unique<optim::PeriodicModelAverager>(2, 0, world));
  optim::GradScaler scaler(scaler_options());
  auto same_everywhere = [&](const std::string& what) {
    for (std::size_t k = 0; k < ps.size(); ++k) {
      std::vector<Tensor> all;
      for (int r = 0; r < n; ++r) all.push_back(Tensor::zeros(ps[k].shape()));
      world.all_gather(all, ps[k]);
      for (int r = 0; r < n; ++r) c.bitwise(all[static_cast<std::size_t>(r)], ps[k], what + ", rank " + std::to_string(r));
    }
  };
  for (int t = 0; t < 5; ++t) {
    set_grads(ps, t, rank, scaler.get_scale());
    if (t == 2 && rank == 1) ps[3].grad().data<float>()[0] = kInf;
    const bool stepped = scaler.step(opt);
    scaler.update();
    c.expect(stepped == (t != 2), "step " + std::to_string(t) + ": stepped " + std::to_string(stepped));
    if (t == 2 || t == 4) same_everywhere("after averaging step " + std::to_string(t));
  }
  c.expect(opt.averager().step() == 5, "averager step " + std::to_string(opt.averager().step()));
  c.expect(opt.steps_skipped() == 1 && opt.steps_taken() == 4, "step counts");
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "zero";
  return dopt::testing::run_peer([&](ProcessGroup& world, int rank) {
    Checker c{rank};
    if (mode == "zero") zero_scenario(world, c);
    else if (mode == "plsgd") plsgd_scenario(world, c);
    else throw dopt::testing::Usage{"dopt_skip_peer zero | plsgd"};
    return c.checks;
  });
}
