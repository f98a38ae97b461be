#pragma once
// CAF 0.17 pins its logger in a thread-local of every thread that spawns an
// actor, publishes one or connects to one (actor_system::spawn_impl calls
// CAF_SET_LOGGER_SYS). ~actor_system waits until the logger is destroyed, so
// a user thread that made such a call and is still alive when its Runtime
// shuts down would hang the shutdown for good. Every dopt entry point that
// touches CAF from a user's thread holds a UserThreadCafScope: on the way out
// it drops the thread-local again, unless the thread had one before (a CAF
// worker, or a thread that set it on purpose).
#include <caf/logger.hpp>

namespace dopt::detail {

class UserThreadCafScope {
 public:
  UserThreadCafScope() noexcept : had_logger_(caf::logger::current_logger() != nullptr) {}
  ~UserThreadCafScope() {
    if (!had_logger_) caf::logger::set_current_actor_system(nullptr);
  }
  UserThreadCafScope(const UserThreadCafScope&) = delete;
  UserThreadCafScope& operator=(const UserThreadCafScope&) = delete;

 private:
  bool had_logger_;
};

}  // namespace dopt::detail
