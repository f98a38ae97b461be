// PostLocalSGDOptimizer growing back (post_local_sgd_catch_up) between the
// ranks of a deterministic simulation: 5 ranks train with Adam and a
// PeriodicModelAverager (averages at steps 1, 3, 5, ...), surviving losses;
// rank 3 is lost before step 2's gradients, the survivors notice it at step
// 3's average, shrink and average over the four of them; a newcomer (rank 5)
// joins before step join_at and catches up from the lowest-ranked member.
// Every rank's final parameters are compared bitwise with a reference
// defined here, all ranks in one thread: each rank's own Adam on its own
// gradients; at each averaging step the ranks there then (ascending) set to
// sum_r (p_r / n) in gloo's ring order (ring_order_reference.hpp); the
// newcomer, at join_at, a copy of rank 0's parameters and Adam state.
#include <catch2/catch.hpp>

#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "dopt/actors/simulate.hpp"
#include "dopt/distributed/post_local_sgd.hpp"
#include "dopt/optim/registry.hpp"
#include "ring_order_reference.hpp"
#include "zero/zero_survive_reference.hpp"

using namespace dopt;
using namespace dopt::optim;
namespace sref = dopt::optim::survive_reference;

namespace {

struct Lost : std::runtime_error {
  Lost() : std::runtime_error("lost by the test's hand") {}
};

const std::vector<std::int64_t> kSizes = {257, 64, 3000, 33, 5, 300};
const OptimizerSpec kInner{"Adam", {{"lr", 0.01}, {"weight_decay", 0.1}}};
constexpr std::int64_t kWarmup = 1, kPeriod = 2;
constexpr int kLost = 3;
constexpr std::int64_t kLostAt = 2;
constexpr int kNewcomer = 5;
constexpr std::int64_t kSteps = 10;

bool averages(std::int64_t t) { return t >= kWarmup && (t - kWarmup) % kPeriod == 0; }

/// The ranks that step t (and, on averaging steps, its average) holds.
std::vector<int> present(std::int64_t t, std::int64_t join_at) {
  std::vector<int> out;
  for (int r = 0; r <= kNewcomer; ++r)
    if ((r != kLost || t < kLostAt) && (r != kNewcomer || t >= join_at)) out.push_back(r);
  return out;
}

void set_rank_grads(const std::vector<Tensor>& params, int r, std::int64_t t) {
  for (std::size_t i = 0; i < params.size(); ++i) {
    Tensor g = Tensor::zeros({kSizes[i]});
    for (std::int64_t k = 0; k < kSizes[i]; ++k) g.data<float>()[k] = sref::grad_elem(r, t, i, k);
    params[i].set_grad(g);
  }
}

/// One rank of the reference: its parameters and its own optimizer.
struct RefRank {
  std::vector<Tensor> params;
  std::unique_ptr<Optimizer> opt;
};

/// sum_r (p_r / n) over `ranks`, per element of the ranks' parameters seen
/// as one flat float32 buffer, in gloo's ring order; written into every one.
void ring_average(std::vector<RefRank>& rs, const std::vector<int>& ranks) {
  std::int64_t total = 0;
  for (auto s : kSizes) total += s;
  const int n = static_cast<int>(ranks.size());
  std::int64_t base = 0;
  for (std::size_t i = 0; i < kSizes.size(); base += kSizes[i], ++i) {
    std::vector<float> avg(static_cast<std::size_t>(kSizes[i]));
    for (std::int64_t k = 0; k < kSizes[i]; ++k) {
      float acc = 0.0f;
      for (int j = 0; j < n; ++j) {
        const int g = ring_reference::contributor(base + k, total, n, j);
        const float v = rs[static_cast<std::size_t>(ranks[static_cast<std::size_t>(g)])].params[i].data<float>()[k] /
                        static_cast<float>(n);
        acc = j == 0 ? v : acc + v;
      }
      avg[static_cast<std::size_t>(k)] = acc;
    }
    for (int r : ranks) std::memcpy(rs[static_cast<std::size_t>(r)].params[i].data<float>(), avg.data(),
                                    avg.size() * sizeof(float));
  }
}

std::vector<std::vector<std::vector<float>>> reference(std::int64_t join_at) {
  std::vector<RefRank> rs(kNewcomer + 1);
  auto make = [](std::vector<Tensor> ps) {
    RefRank r{std::move(ps), nullptr};
    r.opt = make_optimizer(kInner, {OptimizerParamGroup(r.params)});
    return r;
  };
  for (int r = 0; r < kNewcomer; ++r) rs[static_cast<std::size_t>(r)] = make(sref::make_params(kSizes));
  for (std::int64_t t = 0; t < kSteps; ++t) {
    if (t == join_at) {  // a copy of rank 0, the lowest-ranked member
      std::vector<Tensor> ps;
      for (const auto& p : rs[0].params) ps.push_back(p.clone());
      rs[kNewcomer] = make(ps);
      rs[kNewcomer].opt->load_state_dict(rs[0].opt->state_dict());
    }
    const auto ranks = present(t, join_at);
    for (int r : ranks) {
      set_rank_grads(rs[static_cast<std::size_t>(r)].params, r, t);
      rs[static_cast<std::size_t>(r)].opt->step();
    }
    if (averages(t)) ring_average(rs, ranks);
  }
  std::vector<std::vector<std::vector<float>>> out;
  for (const auto& r : rs) {
    out.emplace_back();
    for (const auto& p : r.params) out.back().push_back(p.to_vector<float>());
  }
  return out;
}

std::unique_ptr<PostLocalSGDOptimizer> make_opt(const std::vector<Tensor>& params, const ProcessGroup& g) {
  auto opt = std::make_unique<PostLocalSGDOptimizer>(make_optimizer(kInner, {OptimizerParamGroup(params)}),
                                                     std::make_unique<PeriodicModelAverager>(kPeriod, kWarmup, g));
  opt->enable_survive();
  return opt;
}

struct RankRun {
  std::vector<std::vector<float>> params;
  std::string log;
};

std::vector<RankRun> run(std::int64_t join_at, std::uint64_t seed) {
  std::vector<RankRun> res(kNewcomer + 1);
  std::mutex mu;
  SimulateOptions so;
  so.timeout = std::chrono::seconds(60);
  so.deterministic = true;
  so.seed = seed;
  so.newcomers = 1;
  auto fn = [&](RankContext& ctx) {
    const int me = ctx.rank();
    RankRun out;
    auto params = sref::make_params(kSizes);
    std::unique_ptr<PostLocalSGDOptimizer> opt;
    if (ctx.newcomer()) {
      for (auto& q : params) q.data<float>()[0] = -7.5f;  // overwritten by the catch-up
      // The survivors notice the loss when step 3's average times out, so
      // the newcomer may wait longer than one join_group() waits: it asks again.
      GrowResult joined;
      for (int tries = 0; !joined.group.valid(); ++tries) {
        try {
          joined = ctx.world().join_group();
        } catch (const TimeoutError&) {
          if (tries == 3) throw;
        }
      }
      opt = make_opt(params, joined.group);
      post_local_sgd_catch_up(*opt, joined);
      out.log += "joined at " + std::to_string(opt->steps_taken()) + ";";
    } else {
      opt = make_opt(params, ctx.world());
    }
    while (opt->steps_taken() < kSteps) {
      const std::int64_t t = opt->steps_taken();
      if (t == join_at && !ctx.newcomer()) {
        ProcessGroup old = opt->averager().process_group();
        post_local_sgd_catch_up(*opt, old.grow());
        out.log += "grew at " + std::to_string(t) + ";";
      }
      if (me == kLost && t == kLostAt) throw Lost();
      set_rank_grads(params, me, t);
      try {
        opt->step();
      } catch (const MembershipChangedError&) {
        out.log += "shrank at " + std::to_string(t) + ";";
      }
    }
    for (const auto& q : params) out.params.push_back(q.to_vector<float>());
    std::lock_guard<std::mutex> lock(mu);
    res[static_cast<std::size_t>(me)] = std::move(out);
  };
  try {
    simulate(kNewcomer, fn, so);
  } catch (const Error& e) {
    if (std::string(e.what()).find("lost by the test's hand") == std::string::npos) throw;
  }
  return res;
}

}  // namespace

TEST_CASE("post_local_sgd_catch_up: a rank lost at step 2, a newcomer later: every rank bitwise the reference",
          "[post_local_sgd][grow]") {
  const std::int64_t join_at = GENERATE(4, 5);  // between averages, and at one
  const std::uint64_t seed = GENERATE(1, 2);
  INFO("join at " << join_at << ", seed " << seed);
  const auto res = run(join_at, seed);
  const auto ref = reference(join_at);
  for (int r = 0; r <= kNewcomer; ++r) {
    if (r == kLost) continue;
    const auto& got = res[static_cast<std::size_t>(r)];
    INFO("rank " << r << ": " << got.log);
    REQUIRE(got.params.size() == kSizes.size());
    for (std::size_t i = 0; i < kSizes.size(); ++i) {
      INFO("parameter " << i);
      CHECK(std::memcmp(got.params[i].data(), ref[static_cast<std::size_t>(r)][i].data(),
                        got.params[i].size() * sizeof(float)) == 0);
    }
  }
}
