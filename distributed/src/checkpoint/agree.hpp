#pragma once
// The Checkpointer's agreement between ranks: each rank brings a number and
// the error of its local part (or none); every rank learns every rank's
// number and whether any rank failed. So a save or a load that fails on one
// rank fails on every rank, and the others name it, instead of hanging in the
// next collective or going on with state that differs between ranks.
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "dopt/actors/process_group.hpp"

namespace dopt::checkpoint {

/// Collective on `group` (one all_gather of a small record per rank), called
/// by every rank with its `value` and `local` (null: this rank's part went
/// well). Returns every rank's value, by group rank, when no rank failed.
/// When some did: a rank that failed rethrows its own error; the others
/// throw an error of the same class (IOError, StateDictError, ValueError,
/// StateError; dopt::Error for others) naming `op`, this rank, the lowest
/// failed rank and its message, then `consequence` ("nothing was loaded").
std::vector<std::int64_t> agree(ProcessGroup& group, std::exception_ptr local, std::int64_t value, const char* op,
                                const std::string& consequence);

}  // namespace dopt::checkpoint
