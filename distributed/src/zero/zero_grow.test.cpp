// ZeroRedundancyOptimizer growing back (zero_catch_up) between the ranks of a
// deterministic simulation: 5 ranks train; with redundancy one is lost at
// step k and the survivors recover; a newcomer joins at step k + j (grow,
// join_group), every rank makes a ZeRO over the grown group and catches up;
// training goes on to the end (and, in one test, the newcomer is lost later:
// its shard comes back from the buddy copy the catch-up rebuilt). Every
// rank's final parameters, the newcomer's included, are compared bitwise
// with a reference defined here:
// a plain optimizer (same spec) stepped with, at each step, the mean of the
// gradients of the ranks that contributed to it (grad_elem of
// zero_survive_reference.hpp, summed in rank order, float32 division).
#include <catch2/catch.hpp>

#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "dopt/actors/simulate.hpp"
#include "dopt/distributed/zero.hpp"
#include "dopt/optim/registry.hpp"
#include "zero_survive_reference.hpp"

using namespace dopt;
using namespace dopt::optim;

namespace {

struct Lost : std::runtime_error {
  Lost() : std::runtime_error("lost by the test's hand") {}
};

const std::vector<std::int64_t> kSizes = {257, 64, 3000, 33, 5, 300, 1, 7001, 12};
const OptimizerSpec kAdam{"Adam", {{"lr", 0.01}, {"weight_decay", 0.1}}};

struct Plan {
  int redundancy = 0;
  bool bucket_view = false;
  int lost = -1;              // the rank lost before step lost_at's gradients (-1: none)
  std::int64_t lost_at = 0;
  int lost_later = -1;        // another, lost before step lost_later_at's (after the join)
  std::int64_t lost_later_at = 0;
  std::int64_t join_at = 3;   // the newcomer (rank 5) joins before this step
  std::int64_t steps = 7;
};

/// The ranks whose gradients step t averages.
std::vector<int> contributors(const Plan& p, std::int64_t t) {
  std::vector<int> m;
  for (int r = 0; r < 6; ++r)
    if ((r != p.lost || t < p.lost_at) && (r != p.lost_later || t < p.lost_later_at) && (r < 5 || t >= p.join_at))
      m.push_back(r);
  return m;
}

/// The reference's parameters after p.steps steps.
std::vector<std::vector<float>> reference(const Plan& p) {
  auto ps = survive_reference::make_params(kSizes);
  std::vector<OptimizerParamGroup> groups;
  groups.emplace_back(ps);
  auto opt = make_optimizer(kAdam, std::move(groups));
  for (std::int64_t t = 0; t < p.steps; ++t) {
    const auto m = contributors(p, t);
    for (std::size_t i = 0; i < ps.size(); ++i) {
      Tensor g = Tensor::zeros({kSizes[i]});
      float* d = g.data<float>();
      for (int r : m)
        for (std::int64_t k = 0; k < kSizes[i]; ++k) d[k] += survive_reference::grad_elem(r, t, i, k);
      for (std::int64_t k = 0; k < kSizes[i]; ++k) d[k] /= static_cast<float>(m.size());
      ps[i].set_grad(g);
    }
    opt->step();
  }
  std::vector<std::vector<float>> out;
  for (const auto& q : ps) out.push_back(q.to_vector<float>());
  return out;
}

ZeroOptions options_over(const ProcessGroup& g, const Plan& p) {
  ZeroOptions zo{g};
  zo.redundancy = p.redundancy;
  zo.parameters_as_bucket_view = p.bucket_view;
  // A member's parameters are views of its old optimizer's buckets when it
  // makes the new one; the tensors here are the parameters themselves.
  if (p.bucket_view) zo.rebind_parameter = [](const Tensor&) {};
  return zo;
}

struct Outcome {
  std::vector<std::vector<float>> params;
  std::string log;
};

std::vector<Outcome> run(const Plan& p, std::uint64_t seed) {
  std::vector<Outcome> res(6);
  std::mutex mu;
  SimulateOptions so;
  so.timeout = std::chrono::seconds(60);
  so.deterministic = true;
  so.seed = seed;
  so.newcomers = 1;
  auto fn = [&](RankContext& ctx) {
    const int me = ctx.rank();
    Outcome out;
    auto params = survive_reference::make_params(kSizes);
    ProcessGroup g;
    std::unique_ptr<ZeroRedundancyOptimizer> zero;
    bool grown_yet = ctx.newcomer();
    if (ctx.newcomer()) {
      for (auto& q : params) q.data<float>()[0] = 1e6f;  // what it holds does not matter: it is sent
      auto joined = ctx.world().join_group();
      g = joined.group;
      zero = std::make_unique<ZeroRedundancyOptimizer>(params, kAdam, options_over(g, p));
      zero_catch_up(*zero, nullptr, joined);
      out.log += "joined at " + std::to_string(zero->step_count()) + ";";
    } else {
      g = ctx.world();
      zero = std::make_unique<ZeroRedundancyOptimizer>(params, kAdam, options_over(g, p));
    }
    while (zero->step_count() < p.steps) {
      const std::int64_t t = zero->step_count();
      if (t == p.join_at && !grown_yet) {
        auto grown = g.grow();
        auto bigger = std::make_unique<ZeroRedundancyOptimizer>(params, kAdam, options_over(grown.group, p));
        zero_catch_up(*bigger, zero.get(), grown);
        zero = std::move(bigger);
        g = grown.group;
        out.log += "grew at " + std::to_string(t) + ";";
      }
      try {
        if ((me == p.lost && t == p.lost_at) || (me == p.lost_later && t == p.lost_later_at)) throw Lost();
        survive_reference::set_mean_grads(params, g, me, t);
        zero->step();
      } catch (const PeerLostError&) {
        g = zero->recover().group;
        out.log += "recovered at " + std::to_string(t) + ";";
      }
    }
    for (const auto& q : params) out.params.push_back(q.to_vector<float>());
    std::lock_guard<std::mutex> lock(mu);
    res[static_cast<std::size_t>(me)] = std::move(out);
  };
  try {
    simulate(5, fn, so);
  } catch (const Error& e) {
    if (std::string(e.what()).find("lost by the test's hand") == std::string::npos) throw;
  }
  return res;
}

/// The parameters that differ from the reference in any bit ("" when none).
std::string differing(const Outcome& x, const std::vector<std::vector<float>>& ref) {
  if (x.params.size() != ref.size()) return "all (" + std::to_string(x.params.size()) + " parameters)";
  std::string out;
  for (std::size_t i = 0; i < ref.size(); ++i)
    if (std::memcmp(x.params[i].data(), ref[i].data(), ref[i].size() * sizeof(float)) != 0)
      out += (out.empty() ? "" : ", ") + std::to_string(i);
  return out;
}

/// Every rank that was there at the end (the newcomer included) holds the reference's parameters.
void check_bitwise(const Plan& p, std::uint64_t seed) {
  const auto res = run(p, seed);
  const auto ref = reference(p);
  for (int r = 0; r < 6; ++r)
    if (r != p.lost && r != p.lost_later) {
      INFO("rank " << r << ": " << res[static_cast<std::size_t>(r)].log);
      CHECK(differing(res[static_cast<std::size_t>(r)], ref).empty());
    }
}

}  // namespace

TEST_CASE("zero_catch_up: a newcomer joins 5 ranks and the run is bitwise the reference", "[zero][grow]") {
  const bool bucket_view = GENERATE(false, true);
  const std::uint64_t seed = GENERATE(1, 2);
  INFO("bucket view " << bucket_view << ", seed " << seed);
  Plan p;
  p.bucket_view = bucket_view;
  check_bitwise(p, seed);
}

TEST_CASE("zero_catch_up: redundancy 1, a rank lost at step 2, a newcomer at step 4: bitwise the reference",
          "[zero][grow]") {
  const bool bucket_view = GENERATE(false, true);
  const std::uint64_t seed = GENERATE(3, 4);
  INFO("bucket view " << bucket_view << ", seed " << seed);
  Plan p;
  p.redundancy = 1;
  p.bucket_view = bucket_view;
  p.lost = 3;
  p.lost_at = 2;
  p.join_at = 4;
  check_bitwise(p, seed);
}

TEST_CASE("zero_catch_up: redundancy 1, the copies rebuilt at the join carry a later loss of the newcomer",
          "[zero][grow]") {
  const std::uint64_t seed = GENERATE(5, 6);
  INFO("seed " << seed);
  Plan p;
  p.redundancy = 1;
  p.lost = 3;
  p.lost_at = 2;
  p.join_at = 4;
  p.lost_later = 5;  // the newcomer: its shard (state it received) comes back from its buddy's rebuilt copy
  p.lost_later_at = 6;
  p.steps = 8;
  check_bitwise(p, seed);
}
