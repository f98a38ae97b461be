#pragma once
// Internal to dopt_actors: the thread-locals of dopt that belong to a
// simulated task rather than to its OS thread. The deterministic scheduler
// runs every task as a fiber on one thread, so at each switch it swaps these
// in and out (Scheduler::resume). Each function stores v and returns what
// was there; called by the driver only, between two tasks.
namespace dopt::detail {
/// The label of the running call (collectives/call_label.cpp).
const char* exchange_call_label(const char* v) noexcept;
}  // namespace dopt::detail

namespace dopt::rpc::detail {
/// Whether this runs as a simulated RPC agent (rpc/sim_agent.cpp).
bool exchange_in_sim_agent(bool v) noexcept;
}  // namespace dopt::rpc::detail
