#pragma once
// Test hooks of dopt::rpc: not installed. The library's own tests (unit
// tests, tests/rpc_peer.cpp) include this header to kill a worker, count
// what an agent holds, or send a request several times.
#include <cstddef>

#include "dopt/actors/rpc.hpp"

namespace dopt::rpc::testing {

/// Stops the agent at once, as if its process died: pending calls fail,
/// peers see the worker lost. (A graceful stop is Agent::shutdown.)
void kill(const Agent& agent);
/// Gradient contexts with gradients held by this agent.
std::size_t num_contexts(const Agent& agent);
/// Values owned by this agent.
std::size_t num_owned(const Agent& agent);

/// Agent::rpc_async, but the request is sent `copies` times with one call
/// id: the callee must run it once (the idempotency window).
template <class R = void, class... A>
Future<R> rpc_async_duplicated(const Agent& agent, const To& to, const Fn& fn, int copies, const A&... args) {
  auto spec = detail::make_spec(to, fn, detail::Mode::call, args...);
  spec.copies = copies;
  return detail::typed_result<R>(agent.core(), detail::send_call(agent.core(), std::move(spec)),
                                 "result of '" + fn.name + "'");
}
template <class R = void, class... A>
R rpc_sync_duplicated(const Agent& agent, const To& to, const Fn& fn, int copies, const A&... args) {
  return rpc_async_duplicated<R>(agent, to, fn, copies, args...).get();
}

}  // namespace dopt::rpc::testing
