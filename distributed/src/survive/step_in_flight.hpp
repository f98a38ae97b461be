#pragma once
// What a step_async() leaves in flight (ZeroRedundancyOptimizer's broadcasts,
// PostLocalSGDOptimizer's average): the wait that the calls after it do
// first, and the error they report once it failed (zero.hpp and
// post_local_sgd.hpp, "step_async"). Rank thread.
#include <string>

#include "dopt/actors/future.hpp"

namespace dopt::optim::detail {

/// Waits for `in_flight` when it is valid, and leaves it invalid. When it
/// failed and `keep_error`, `failed` becomes `what` + its error's message.
/// Then, when `failed` is set (now or by an earlier call), throws StateError
/// naming `op` with it: the ranks' parameters may differ from then on.
void settle_in_flight(Future<void>& in_flight, std::string& failed, const std::string& what, bool keep_error,
                      const std::string& op, int rank);

}  // namespace dopt::optim::detail
