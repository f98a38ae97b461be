#pragma once
// Internal: what distributed_optimizer.cpp and distributed_optimizer_survive.cpp
// share.
#include <exception>
#include <string>
#include <vector>

#include "dopt/distributed/distributed_optimizer.hpp"

namespace dopt::optim::detail {

/// "worker 'NAME' (rank R)".
std::string owner_name(const rpc::WorkerInfo& w);
/// One error naming every failed owner (errors[i] of owner who[i]), of the
/// first failure's type; null when none failed. Without redundancy a lost
/// owner's message adds that its state is gone and the checkpoint fall-back.
std::exception_ptr joined_error(const std::vector<std::exception_ptr>& errors, const std::vector<rpc::WorkerInfo>& who,
                                const std::string& op, int rank, bool redundant);

}  // namespace dopt::optim::detail
