#pragma once
// The tests of errors that name the users' calls (call_label.hpp): how such
// an error lists the ranks that were in one call.
#include <string>

namespace dopt::testing {

/// "on ranks 0, 2, 3, 4": the ranks of [0, world) but `except` ("on rank 0"
/// when only one is left).
inline std::string on_ranks_but(int world, int except) {
  std::string s;
  for (int r = 0; r < world; ++r)
    if (r != except) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return (world - 1 == 1 ? "on rank " : "on ranks ") + s;
}

}  // namespace dopt::testing
