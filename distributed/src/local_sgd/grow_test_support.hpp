#pragma once
// What the growing-back tests of post-local SGD and DiLoCo share
// (post_local_sgd_grow.test.cpp, diloco_grow.test.cpp): the run over a
// deterministic simulation with one newcomer, the ranks' gradients, the
// newcomer's join, who is there at which step, a rank of a post-local SGD
// run, the reference's ranks and ring sum, and the bitwise comparison (also
// reducer_grow.test.cpp). Rank
// functions run on their rank's thread; the rest on the test's.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "dopt/actors/simulate.hpp"
#include "dopt/distributed/post_local_sgd.hpp"
#include "dopt/optim/registry.hpp"
#include "dopt/runtime/tensor.hpp"
#include "ring_order_reference.hpp"
#include "zero/zero_survive_reference.hpp"

namespace dopt::grow_test {

/// Each parameter's values, per rank.
using Params = std::vector<std::vector<float>>;

struct Lost : std::runtime_error {
  Lost() : std::runtime_error("lost by the test's hand") {}
};

/// Rank r's gradients of step t: parameter i's element k is grad_elem(r, t, i, k).
inline void set_rank_grads(const std::vector<Tensor>& params, int r, std::int64_t t) {
  for (std::size_t i = 0; i < params.size(); ++i) {
    Tensor g = Tensor::zeros({params[i].numel()});
    for (std::int64_t k = 0; k < params[i].numel(); ++k)
      g.data<float>()[k] = optim::survive_reference::grad_elem(r, t, i, k);
    params[i].set_grad(g);
  }
}

/// A newcomer's join_group(). The survivors notice a loss when their
/// collective times out, so the newcomer may wait longer than one
/// join_group() waits: it asks again (at most 4 times).
inline GrowResult join_patiently(RankContext& ctx) {
  for (int tries = 0;; ++tries) {
    try {
      return ctx.world().join_group();
    } catch (const TimeoutError&) {
      if (tries == 3) throw;
    }
  }
}

inline Params values_of(const std::vector<Tensor>& params) {
  Params out;
  for (const auto& p : params) out.push_back(p.to_vector<float>());
  return out;
}

/// Who is there at which step: ranks 0 .. newcomer - 1 from the start but
/// `lost` from step lost_at on; the newcomer (rank `newcomer`) from join_at on.
struct Plan {
  int lost = 3;
  std::int64_t lost_at = 2;
  int newcomer = 5;
  std::int64_t join_at = 4;

  /// The ranks there at step t, ascending.
  std::vector<int> present(std::int64_t t) const {
    std::vector<int> out;
    for (int r = 0; r <= newcomer; ++r)
      if ((r != lost || t < lost_at) && (r != newcomer || t >= join_at)) out.push_back(r);
    return out;
  }
};

/// The ranks of a reference run, in one thread: each rank's parameters
/// (survive_reference::make_params) and its own optimizer (`spec`).
class RefRanks {
 public:
  RefRanks(const Plan& plan, std::vector<std::int64_t> sizes, optim::OptimizerSpec spec)
      : plan_(plan), sizes_(std::move(sizes)), spec_(std::move(spec)), params_(plan.newcomer + 1),
        opts_(plan.newcomer + 1) {
    for (int r = 0; r < plan_.newcomer; ++r) make(r, optim::survive_reference::make_params(sizes_));
  }

  /// Step t's local part: at join_at the newcomer becomes a copy of rank 0
  /// (the lowest-ranked member: its parameters and optimizer state); then
  /// every rank there sets its gradients (set_rank_grads) and steps. Returns
  /// the ranks there.
  std::vector<int> step(std::int64_t t) {
    if (t == plan_.join_at) {
      std::vector<Tensor> copy;
      for (const auto& p : params_[0]) copy.push_back(p.clone());
      make(plan_.newcomer, copy);
      opts_[static_cast<std::size_t>(plan_.newcomer)]->load_state_dict(opts_[0]->state_dict());
    }
    const auto ranks = plan_.present(t);
    for (int r : ranks) {
      set_rank_grads(params_[static_cast<std::size_t>(r)], r, t);
      opts_[static_cast<std::size_t>(r)]->step();
    }
    return ranks;
  }

  std::vector<Tensor>& params(int r) { return params_[static_cast<std::size_t>(r)]; }

  std::vector<Params> values() const {
    std::vector<Params> out;
    for (const auto& ps : params_) out.push_back(values_of(ps));
    return out;
  }

 private:
  void make(int r, std::vector<Tensor> ps) {
    params_[static_cast<std::size_t>(r)] = std::move(ps);
    opts_[static_cast<std::size_t>(r)] =
        optim::make_optimizer(spec_, {optim::OptimizerParamGroup(params_[static_cast<std::size_t>(r)])});
  }

  Plan plan_;
  std::vector<std::int64_t> sizes_;
  optim::OptimizerSpec spec_;
  std::vector<std::vector<Tensor>> params_;
  std::vector<std::unique_ptr<optim::Optimizer>> opts_;
};

/// sum over the n group ranks of value(g), in gloo's ring order for element
/// e of a flat float32 buffer of numel elements (the first term taken as is).
template <class Value>
float ring_sum(std::int64_t e, std::int64_t numel, int n, const Value& value) {
  float acc = 0.0f;
  for (int j = 0; j < n; ++j) {
    const float v = value(ring_reference::contributor(e, numel, n, j));
    acc = j == 0 ? v : acc + v;
  }
  return acc;
}

/// Runs fn(ctx, log) on `world` ranks and one newcomer (deterministic,
/// `seed`); returns each rank's final parameters (what fn returned; empty
/// for the rank that threw Lost) and log.
inline std::vector<std::pair<Params, std::string>> run_with_newcomer(
    int world, std::uint64_t seed, const std::function<Params(RankContext&, std::string&)>& fn) {
  SimulateOptions so;
  so.timeout = std::chrono::seconds(60);
  so.deterministic = true;
  so.seed = seed;
  so.newcomers = 1;
  std::vector<std::pair<Params, std::string>> res(static_cast<std::size_t>(world + 1));
  std::mutex mu;
  try {
    simulate(world, [&](RankContext& ctx) {
      std::string log;
      Params ps = fn(ctx, log);
      std::lock_guard<std::mutex> lock(mu);
      res[static_cast<std::size_t>(ctx.rank())] = {std::move(ps), std::move(log)};
    }, so);
  } catch (const Error& e) {
    if (std::string(e.what()).find("lost by the test's hand") == std::string::npos) throw;
  }
  return res;
}

using MakeOptimizer =
    std::function<std::unique_ptr<optim::PostLocalSGDOptimizer>(const std::vector<Tensor>&, const ProcessGroup&)>;

/// One rank of a post-local SGD or DiLoCo run (the newcomer too), on its
/// thread: `make` builds its optimizer over a group; a newcomer joins
/// (join_patiently) and catches up, the members grow and catch up before
/// step plan.join_at (post_local_sgd_catch_up); plan.lost throws Lost at
/// plan.lost_at; every step sets the rank's gradients and calls step(). A
/// MembershipChangedError is logged; a PeerLostError goes to `rebuild` (which
/// replaces the optimizer with one over the survivors), or is rethrown when
/// it is empty. Returns the final parameters.
inline Params plsgd_rank_run(RankContext& ctx, std::string& log, const Plan& plan, std::int64_t steps,
                             const std::vector<std::int64_t>& sizes, const MakeOptimizer& make,
                             const std::function<void(std::unique_ptr<optim::PostLocalSGDOptimizer>&)>& rebuild) {
  const int me = ctx.rank();
  auto params = optim::survive_reference::make_params(sizes);
  std::unique_ptr<optim::PostLocalSGDOptimizer> opt;
  if (ctx.newcomer()) {
    for (auto& q : params) q.data<float>()[0] = -7.5f;  // overwritten by the catch-up
    auto joined = join_patiently(ctx);
    opt = make(params, joined.group);
    optim::post_local_sgd_catch_up(*opt, joined);
    log += "joined at " + std::to_string(opt->averager().step()) + ";";
  } else {
    opt = make(params, ctx.world());
  }
  while (opt->averager().step() < steps) {
    const std::int64_t t = opt->averager().step();
    if (t == plan.join_at && !ctx.newcomer()) {
      ProcessGroup old = opt->averager().process_group();
      optim::post_local_sgd_catch_up(*opt, old.grow());
      log += "grew at " + std::to_string(t) + ";";
    }
    if (me == plan.lost && t == plan.lost_at) throw Lost();
    set_rank_grads(params, me, t);
    try {
      opt->step();
    } catch (const optim::MembershipChangedError&) {
      log += "shrank at " + std::to_string(t) + ";";
    } catch (const PeerLostError&) {
      if (!rebuild) throw;
      rebuild(opt);
      log += "shrank at " + std::to_string(t) + ";";
    }
  }
  return values_of(params);
}

/// Every rank but `lost` holds its reference parameters, bit for bit.
inline void check_bitwise(const std::vector<std::pair<Params, std::string>>& got, const std::vector<Params>& ref,
                          int lost) {
  for (std::size_t r = 0; r < got.size(); ++r) {
    if (static_cast<int>(r) == lost) continue;
    INFO("rank " << r << ": " << got[r].second);
    REQUIRE(got[r].first.size() == ref[r].size());
    for (std::size_t i = 0; i < ref[r].size(); ++i) {
      INFO("parameter " << i);
      CHECK(std::memcmp(got[r].first[i].data(), ref[r][i].data(), ref[r][i].size() * sizeof(float)) == 0);
    }
  }
}

}  // namespace dopt::grow_test
