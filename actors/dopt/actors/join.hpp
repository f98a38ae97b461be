#pragma once
// dopt::Join / Joinable / JoinHook: training with uneven inputs across ranks
// (torch 1.13 torch.distributed.algorithms.join).
//
//   dopt::Join join({&model, &optimizer});        // the first one notifies
//   for (auto& batch : my_batches) { ...; optimizer.step(); }
//   join.finish();                                 // torch: leaving the `with` block
//
// Protocol (identical to torch's, over any dopt::ProcessGroup):
//  - A rank that still has inputs calls Join::notify_join_context(j) once per
//    iteration from its *first* joinable (a Joinable calls it itself at the
//    start of its per-iteration collective work, e.g. ZeRO's step()); this
//    posts an async all_reduce(SUM) of a float32 [1] tensor holding 1.
//  - A rank that ran out of inputs calls finish(). It loops: all_reduce(SUM)
//    of a float32 [1] zero (matching the others' notify all-reduce); when the
//    sum is 0 every rank has joined and the loop ends; otherwise it runs every
//    hook's main_hook() in joinable order, which must issue exactly the
//    collectives the non-joined ranks issue in that iteration ("shadowing").
//    After the loop every hook's post_hook(is_last_joiner) runs; is_last_joiner
//    is true on the ranks that never ran a main hook.
//  - throw_on_early_termination: non-joined ranks also do a blocking
//    all_reduce of 0 after the notify; the first rank to join contributes 1
//    there and every rank throws EarlyTerminationError (the joined rank
//    "Rank R exhausted all inputs.", the others "Detected at least one rank
//    that exhausted inputs. Throwing across all ranks.").
//
// Who calls what: every rank of the joinables' process group constructs a Join
// over the same joinables (same kinds, same order) and calls finish() once it
// has no more inputs. All joinables must share one process group (ValueError).
//
// Differences from torch (docs/zero.md):
//  - While finish() runs its loop, notify_join_context is a no-op on that rank:
//    a main hook that re-enters the joinable's normal work (ZeRO's hook calls
//    step(), which notifies) no longer issues the extra all-reduce that made
//    torch 1.13 hang when ZeRO was the first joinable.
//  - finish() (or the destructor) disables the joinables' join configuration
//    again; torch leaves it enabled, so its first joinable keeps posting notify
//    all-reduces after the block.
//  - join_hook() takes no keyword arguments; a joinable that needs data for its
//    hook holds it itself.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dopt/actors/future.hpp"
#include "dopt/actors/process_group.hpp"
#include "dopt/runtime/error.hpp"
#include "dopt/runtime/tensor.hpp"

namespace dopt {

/// Thrown by throw_on_early_termination (torch: RuntimeError).
class EarlyTerminationError : public StateError {
 public:
  using StateError::StateError;
};

/// What a joined rank runs instead of its per-iteration collectives.
class JoinHook {
 public:
  virtual ~JoinHook() = default;
  /// Once per iteration in which some rank has not joined yet; must shadow
  /// the collectives of that iteration.
  virtual void main_hook() {}
  /// Once, after every rank joined.
  virtual void post_hook(bool /*is_last_joiner*/) {}
};

/// The per-joinable configuration a Join sets (torch's _JoinConfig).
struct JoinConfig {
  bool enable = false;
  bool throw_on_early_termination = false;
  bool is_first_joinable = false;
  /// True on this rank while its finish() loop runs (dopt: notify is then a no-op).
  bool joined = false;
};

class Joinable {
 public:
  virtual ~Joinable() = default;
  /// A fresh hook; called by Join's constructor.
  virtual std::unique_ptr<JoinHook> join_hook() = 0;
  /// Device of the Join's all-reduce tensors.
  virtual Device join_device() const = 0;
  virtual ProcessGroup join_process_group() const = 0;

  const JoinConfig& join_config() const noexcept { return join_config_; }

 protected:
  Joinable() = default;
  Joinable(const Joinable&) = default;
  Joinable& operator=(const Joinable&) = default;

 private:
  friend class Join;
  JoinConfig join_config_;
};

struct JoinOptions {
  bool enable = true;
  bool throw_on_early_termination = false;
};

class Join {
 public:
  /// Builds the hooks and enables the joinables' configuration (the first one
  /// becomes the notifier). Throws ValueError for an empty list, a null
  /// joinable, a joinable listed twice, or joinables of different process
  /// groups ("Using join context manager with multiple process groups"). No
  /// collective happens here.
  explicit Join(std::vector<Joinable*> joinables, JoinOptions options = {});
  /// Disables the joinables' configuration. Does not run the join loop (a
  /// destructor must not block on collectives): call finish() on the normal
  /// path. After an exception, just let the Join go.
  ~Join();
  Join(const Join&) = delete;
  Join& operator=(const Join&) = delete;

  /// Runs the join loop described in the header (a collective over the
  /// process group), then the post hooks, then disables the configuration.
  /// Calling it twice is a StateError. With enable=false it only disables.
  void finish();

  /// Called by a joinable once per iteration, before its collectives. Returns
  /// the notify all-reduce (a ready future when the joinable is not the first
  /// of an enabled Join, or when this rank is inside finish()). Throws
  /// EarlyTerminationError in throw mode when some rank has joined.
  static Future<void> notify_join_context(Joinable& joinable);

  /// Iterations the join loop ran on this rank (0 before finish()).
  std::int64_t iterations() const noexcept { return iterations_; }

 private:
  void disable() noexcept;

  std::vector<Joinable*> joinables_;
  std::vector<std::unique_ptr<JoinHook>> hooks_;
  JoinOptions options_;
  ProcessGroup group_;
  Device device_;
  bool finished_ = false;
  std::int64_t iterations_ = 0;
};

}  // namespace dopt
