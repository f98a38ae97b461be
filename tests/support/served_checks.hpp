#pragma once
// Catch2 assertions from the worker threads of rpc::simulate: Catch2 2.x is
// not thread-safe, so they run under one lock, a ServedMutex (the checked
// expression may make RPC calls, a scheduling point of the deterministic
// scheduler). Any thread.
#include <catch2/catch.hpp>

#include <mutex>

#include "dopt/actors/internal/served_mutex.hpp"

namespace dopt::testing {

inline dopt::rpc::detail::ServedMutex& catch_lock() {
  static dopt::rpc::detail::ServedMutex m;
  return m;
}

}  // namespace dopt::testing

#define SERVED_CHECK_THAT(a, m)                                                         \
  do {                                                                                  \
    std::lock_guard<dopt::rpc::detail::ServedMutex> l_(dopt::testing::catch_lock()); \
    CHECK_THAT(a, m);                                                                   \
  } while (0)
