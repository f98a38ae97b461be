// zero_stage2_options (zero.hpp): the Reducer options of ZeRO stage 2, the
// owners of the reducer's parameters from the optimizer's partition, after
// refusing what stage 2 cannot serve. The sharding itself is the Reducer's
// (ddp/reducer.cpp); the step is stage 1's.
#include <string>

#include "dopt/distributed/zero.hpp"

namespace dopt::optim {

ReducerOptions zero_stage2_options(const ZeroRedundancyOptimizer& zero, const std::vector<Tensor>& params,
                                   ReducerOptions options) {
  static constexpr const char* op = "zero_stage2_options";
  const int rank = zero.rank();
  if (zero.redundancy() > 0)
    throw NotSupportedError(op, "the optimizer has redundancy " + std::to_string(zero.redundancy()) +
                                    ": its buddies step other ranks' shards from their averaged gradients, which "
                                    "stage 2 does not keep (use redundancy = 0, or stage 1)", rank);
  if (zero.overlap_with_ddp())
    throw NotSupportedError(op, "the optimizer was built with overlap_with_ddp, which steps from the reducer's comm "
                                "hook (stage 1 only)", rank);
  if (options.survive)
    throw NotSupportedError(op, "ReducerOptions::survive: a recovery would need every rank's averaged gradients, "
                                "which stage 2 does not keep", rank);
  const std::vector<int> by_global = zero.param_owners();
  options.gradient_owners.clear();
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (!params[i].defined()) throw ValueError(op, "parameter " + std::to_string(i) + " is undefined", rank);
    const std::int64_t gi = zero.global_index(params[i]);
    if (gi < 0)
      throw ValueError(op, "parameter " + std::to_string(i) + " (" + params[i].str() +
                               ") is not one of the optimizer's parameters", rank);
    options.gradient_owners.push_back(by_global[static_cast<std::size_t>(gi)]);
  }
  return options;
}

}  // namespace dopt::optim
