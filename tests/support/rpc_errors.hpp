#pragma once
// What an RPC call failed with, as one comparable line, for the tests of
// dopt::rpc users (DistributedOptimizer's unit tests, tests/rpc_peer.cpp).
// Any thread; it runs f on the caller's.
#include <exception>
#include <functional>
#include <string>

#include "dopt/actors/rpc.hpp"
#include "dopt/runtime/error.hpp"

namespace dopt::testing {

/// "KIND: MESSAGE" of what f threw (KIND as rpc::error_kind names it; "std"
/// for another std::exception), or "no error".
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return rpc::error_kind(e) + ": " + e.what();
  } catch (const std::exception& e) {
    return std::string("std: ") + e.what();
  }
  return "no error";
}

}  // namespace dopt::testing
