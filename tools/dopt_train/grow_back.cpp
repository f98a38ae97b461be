#include "grow_back.hpp"

#include <utility>

#include "dopt/runtime/error.hpp"
#include "dopt/runtime/settings.hpp"

namespace dopt_train {

std::int64_t join_back(dopt::ProcessGroup& world, std::unique_ptr<Strategy>& strategy, const StrategyConfig& cfg,
                       const std::vector<Tensor>& params) {
  dopt::GrowResult joined;
  for (int tries = 0;; ++tries) {
    try {
      joined = world.join_group();
      break;
    } catch (const dopt::TimeoutError&) {
      if (tries == 3) throw;
    }
  }
  world = joined.group;
  strategy = grow_strategy(cfg, params, joined, nullptr);
  Tensor at = Tensor::from_vector(std::vector<std::int64_t>{0});
  world.broadcast(at, 0);
  return at.to_vector<std::int64_t>()[0];
}

std::vector<int> grow_back(dopt::ProcessGroup& world, std::unique_ptr<Strategy>& strategy, const StrategyConfig& cfg,
                           const std::vector<Tensor>& params, std::int64_t step, bool& may_grow) {
  int waiting = 0;
  try {
    waiting = world.newcomers_waiting();
  } catch (const dopt::NotSupportedError&) {
    may_grow = false;  // the group's plane cannot grow (MPI, ...): the same on every member
    return {};
  }
  if (waiting == 0) return {};
  dopt::GrowResult grown = world.grow({.newcomers = waiting});
  std::unique_ptr<Strategy> bigger = grow_strategy(cfg, params, grown, strategy.get());
  strategy = std::move(bigger);
  world = grown.group;
  Tensor at = Tensor::from_vector(std::vector<std::int64_t>{step});
  world.broadcast(at, 0);
  return grown.joined;
}

dopt::NotSupportedError no_survival_after_rejoin(int rank, std::int64_t step, const std::string& rejoin,
                                                 const dopt::PeerLostError& lost) {
  return dopt::NotSupportedError("dopt-train --survive",
                                 "step " + std::to_string(step + 1) + ": a rank was lost after the group grew back (" +
                                     rejoin + "); a grown-back run does not survive a further loss yet: " +
                                     lost.detail(),
                                 rank);
}

bool came_after_job_ended(const std::exception& e) {
  const std::string what = e.what();
  return dopt::settings::integer("DOPT_REPLACES").has_value() && dynamic_cast<const dopt::PeerLostError*>(&e) &&
         (what.find("rank 0 is gone") != std::string::npos ||
          what.find("the job ended") != std::string::npos);
}

}  // namespace dopt_train
