#pragma once
// Internal: what distributed_optimizer.cpp and distributed_optimizer_survive.cpp
// share.
#include <cstdint>
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

/// Refuses (StateError naming op) a message of another membership epoch than
/// the one this worker committed for `line`.
void check_epoch(rpc::Agent& a, std::uint64_t line, std::uint64_t epoch, const char* op);
/// The owner probe of distributed_optimizer_testing.hpp (false when none).
bool owner_probe(rpc::Agent& a, const char* point, long step);
/// Registers the grow-back functions (distributed_optimizer_grow.cpp); called
/// by DistributedOptimizer::register_functions.
void register_grow_functions();

}  // namespace dopt::optim::detail
