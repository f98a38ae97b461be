#pragma once
// What a call threw, as its message, for the tests that compare an error's
// text: what_thrown<ValueError>([&] { ... }). Any thread; it runs f on the
// caller's. (For what an RPC call failed with, kind included: rpc_errors.hpp.)
#include <functional>
#include <string>

namespace dopt::testing {

/// what() of the E that f throws; "" when f returns. Anything else f throws
/// goes on to the caller.
template <class E>
std::string what_thrown(const std::function<void()>& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "";
}

}  // namespace dopt::testing
