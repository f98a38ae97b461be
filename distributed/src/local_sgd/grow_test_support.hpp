#pragma once
// What the simulated growing-back tests of post-local SGD and DiLoCo share
// (post_local_sgd_grow.test.cpp, diloco_grow.test.cpp): the run over a
// deterministic simulation with newcomers, the newcomer's join, a rank of a post-local SGD run, and the
// bitwise comparison (also reducer_grow.test.cpp). The reference runs, the
// ranks' gradients and who is there at which step are grow_reference.hpp's
// (shared with tests/local_sgd_grow_peer.cpp). Rank functions run on their
// rank's thread; the rest on the test's.
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
#include "dopt/runtime/tensor.hpp"
#include "grow_reference.hpp"

namespace dopt::grow_test {

struct Lost : std::runtime_error {
  Lost() : std::runtime_error("lost by the test's hand") {}
};

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

/// Runs fn(ctx, log) on `world` ranks and `newcomers` newcomers
/// (deterministic, `seed`); returns each rank's final parameters (what fn
/// returned; empty for the rank that threw Lost) and log.
inline std::vector<std::pair<Params, std::string>> run_with_newcomer(
    int world, std::uint64_t seed, const std::function<Params(RankContext&, std::string&)>& fn, int newcomers = 1) {
  SimulateOptions so;
  so.timeout = std::chrono::seconds(60);
  so.deterministic = true;
  so.seed = seed;
  so.newcomers = newcomers;
  std::vector<std::pair<Params, std::string>> res(static_cast<std::size_t>(world + newcomers));
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

/// One rank of a post-local SGD or DiLoCo run (a newcomer too), on its
/// thread: `make` builds its optimizer over a group; a newcomer joins
/// (join_patiently) and catches up, the members grow by plan.newcomers and
/// catch up before step plan.join_at (post_local_sgd_catch_up); plan.lost
/// throws Lost at plan.lost_at; with `barrier_each_step` every step then
/// starts with a barrier of the averager's group (so that the survivors see
/// a loss there, before an average changed anything: for the averagers
/// without enable_survive); every step sets the rank's gradients and calls
/// step(). A MembershipChangedError is logged; a PeerLostError goes to
/// `rebuild` (which replaces the optimizer with one over the survivors), or
/// is rethrown when it is empty. Returns the final parameters.
inline Params plsgd_rank_run(RankContext& ctx, std::string& log, const Plan& plan, std::int64_t steps,
                             const std::vector<std::int64_t>& sizes, const MakeOptimizer& make,
                             const std::function<void(std::unique_ptr<optim::PostLocalSGDOptimizer>&)>& rebuild,
                             bool barrier_each_step = false) {
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
      GrowOptions more;
      more.newcomers = plan.newcomers;
      optim::post_local_sgd_catch_up(*opt, old.grow(more));
      log += "grew at " + std::to_string(t) + ";";
    }
    if (me == plan.lost && t == plan.lost_at) throw Lost();
    if (barrier_each_step) {
      try {
        ProcessGroup g = opt->averager().process_group();
        g.barrier();
      } catch (const PeerLostError&) {
        if (!rebuild) throw;
        rebuild(opt);
        log += "shrank at " + std::to_string(t) + ";";
      }
    }
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
