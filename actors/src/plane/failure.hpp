#pragma once
// How a call failed, in a form that travels between rank actors, and the
// dopt::Error it becomes for the user.
#include <cstdint>
#include <exception>
#include <string>

#include "dopt/runtime/error.hpp"

namespace dopt::detail {

enum class FailKind : int { timeout = 1, peer_lost, mismatch, state };

struct Failure {
  FailKind kind = FailKind::state;
  std::string op;
  std::string msg;
};

inline std::exception_ptr to_exception(const Failure& f, int rank) {
  switch (f.kind) {
    case FailKind::timeout: return std::make_exception_ptr(TimeoutError(f.op, f.msg, rank));
    case FailKind::peer_lost: return std::make_exception_ptr(PeerLostError(f.op, f.msg, rank));
    case FailKind::mismatch: return std::make_exception_ptr(CollectiveMismatchError(f.op, f.msg, rank));
    case FailKind::state: break;
  }
  return std::make_exception_ptr(StateError(f.op, f.msg, rank));
}

[[noreturn]] inline void throw_failure(const Failure& f, int rank) { std::rethrow_exception(to_exception(f, rank)); }

/// "world group" / "group 65536".
inline std::string group_str(std::uint64_t gid) {
  return gid == 0 ? "world group" : "group " + std::to_string(gid);
}

}  // namespace dopt::detail
