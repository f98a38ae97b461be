#pragma once
// dopt::Runtime: the actor system embedded in the user's program.
//
// A Runtime owns one CAF actor_system (no CAF_MAIN: the user's main() stays
// theirs). Its worker threads start in the constructor and are joined by
// shutdown() / the destructor, which first tells every rank actor the runtime
// started to exit, so that shutting down never waits on an actor cycle and
// never hangs, also after an error. Pending operations are failed with a
// StateError when their rank actor exits.
//
// CAF is configured explicitly (see docs/architecture.md and
// shared/research/caf-0.17-notes.md section 6):
//   scheduler.max-threads                 = options.threads
//   scheduler.policy                      = options.policy ("stealing" | "sharing")
//   work-stealing.moderate-poll-attempts  = options.moderate_poll_attempts (0:
//     idle workers go straight from spinning to a condition-variable wait, which
//     cuts foreign-thread -> actor latency from ~80 us to ~5-10 us)
// No CAF types appear in this header.
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

namespace dopt {

struct RuntimeOptions {
  /// CAF scheduler worker threads; 0 = hardware threads of this process.
  int threads = 0;
  /// "stealing" (default) or "sharing".
  std::string policy = "stealing";
  /// work-stealing.moderate-poll-attempts (CAF default 500; ours 0).
  int moderate_poll_attempts = 0;
  /// Default timeout of every wait of a collective (per group, settable).
  std::chrono::milliseconds collective_timeout{std::chrono::seconds(300)};
  /// Real processes: a peer process not heard from for this long (it sends a
  /// heartbeat every peer_timeout / 4) is lost: stopped, hung or cut off. One
  /// that dies is lost at once (its connections close).
  std::chrono::milliseconds peer_timeout{std::chrono::seconds(10)};

  /// Defaults overridden by the environment:
  ///   DOPT_THREADS            positive integer -> threads
  ///   DOPT_SCHEDULER_POLICY   stealing | sharing -> policy
  ///   DOPT_TIMEOUT_MS         positive integer -> collective_timeout
  ///   DOPT_PEER_TIMEOUT_MS    positive integer -> peer_timeout
  /// A malformed value throws dopt::ValueError naming the variable.
  static RuntimeOptions from_env();
  /// Throws dopt::ValueError for out-of-range values.
  void validate() const;
};

class Runtime {
 public:
  /// The actor system and what runs on it (opaque: defined and used by the
  /// library only).
  class Impl;
  /// The library's own access to the actor system (opaque).
  struct Access;

  /// Starts the actor system. Throws dopt::ValueError for bad options.
  explicit Runtime(RuntimeOptions options = RuntimeOptions::from_env());
  /// shutdown().
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  /// Stops every actor this runtime spawned, then joins CAF's threads.
  /// Idempotent; after it, running() is false and no new ranks can be made.
  void shutdown() noexcept;
  bool running() const noexcept;
  const RuntimeOptions& options() const noexcept;
  /// The worker thread count actually configured.
  int threads() const noexcept;

 private:
  Impl& impl();
  std::unique_ptr<Impl> impl_;
};

}  // namespace dopt
