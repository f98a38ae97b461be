#pragma once
// Internal: which public call issued a collective, so that errors name the
// user's call ("ZeroRedundancyOptimizer::step()") before the internal
// operation ("broadcast_coalesced(...)"). docs/troubleshooting.md shows the
// messages.
//
// Who calls: every public entry point of dopt that issues collectives opens
// a CallScope on the calling thread as its first statement; ProcessGroup's
// own methods open one too, so a direct call is named
// "ProcessGroup::all_reduce()". The outermost scope on a thread wins: an
// optimizer's step() that calls a Reducer names the step. ProcessGroup
// captures current_call() into the call's descriptor when it is submitted
// (CollDesc::caller); work that issues collectives later on another thread
// (a continuation) captures current_call() when the async call starts and
// opens a CallScope with it there.
//
// Threads: the scope is thread-local; nothing waits.
#include <string>
#include <utility>
#include <vector>

namespace dopt::detail {

/// Names the public call `label` (a string literal: it must outlive every
/// collective it issues) for the collectives this thread issues until the
/// scope ends, unless an outer scope already names one.
class CallScope {
 public:
  explicit CallScope(const char* label) noexcept;
  ~CallScope();
  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;

 private:
  bool named_ = false;
};

/// The label of this thread's outermost open CallScope; nullptr outside any.
const char* current_call() noexcept;

/// The public calls of a collective's members grouped by call, in the order
/// of each call's lowest rank: "ZeroRedundancyOptimizer::step() on ranks 0,
/// 2; PostLocalSGDOptimizer::step() on rank 1". `calls`: (global rank, label);
/// an empty label reads "an unnamed call".
std::string calls_by_rank(const std::vector<std::pair<int, std::string>>& calls);

/// What a CollectiveMismatchError says: the users' calls first, then what
/// the planes compared: "<calls_by_rank>; internally: <internal>".
std::string mismatch_text(const std::vector<std::pair<int, std::string>>& calls, const std::string& internal);

/// RPC: the public call an internal RPC function stands for, so that its
/// errors name the user's call first: name_rpc_function("dopt.optim.step",
/// "DistributedOptimizer::step()"). Called where the function is
/// registered (any thread, before the calls); rpc_function_call gives ""
/// for a function without one.
void name_rpc_function(const std::string& fn, const std::string& public_call);
std::string rpc_function_call(const std::string& fn);

}  // namespace dopt::detail
