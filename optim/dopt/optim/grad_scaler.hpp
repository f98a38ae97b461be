#pragma once
// Loss scaling for 16-bit gradients (torch.cuda.amp.GradScaler's algorithm,
// on the CPU and for every dopt optimizer), and the agreement of all ranks
// on steps to skip when some rank's gradients hold inf or NaN.
//
//   GradScaler scaler;                          // scale 65536, x2 every 2000 good steps
//   for (...) {
//     backward(scaler.scale(loss));             // gradients of loss * scale
//     scaler.unscale_(zero);                    // optional: before clipping
//     clip_grad_norm(zero, 1.0);
//     scaler.step(zero);                        // skipped on every rank if any rank saw inf/NaN
//     scaler.update();                          // back-off after a skip, growth after a streak
//   }
//
// Contract (as torch): per iteration and optimizer, unscale_ at most once,
// then step once, then update() once for all optimizers of the iteration.
// unscale_ multiplies the gradients by 1/scale (rounded to float32 once, as
// torch) and records whether any gradient element is inf or NaN; step
// unscales first if unscale_ was not called, then steps unless inf/NaN was
// found. update() multiplies the scale by backoff_factor when any optimizer
// of the iteration found inf/NaN (and restarts the growth count), else
// counts a good step and multiplies the scale by growth_factor after
// growth_interval good steps in a row (a scale that would overflow float32
// is not taken). The scale is a float32 value, as in torch.
//
// Agreement (beyond torch, which checks only the local gradients): a step
// that one rank must skip is skipped on every rank. With ZeRO the flag is
// all-reduced (max) over zero.process_group() after each rank checked the
// gradients it owns (the only ones its step reads; they are also the only
// ones unscaled); with PostLocalSGDOptimizer over the averager's group, and
// a skipped step still runs the averager on schedule (skip_step); with a
// plain optimizer over GradScalerOptions::process_group when it is set
// (e.g. DDP ranks). These are collectives: every rank calls unscale_/step
// in the same order. A DistributedOptimizer trainer decides alone (its
// gradients are its own).
//
// Gradients: float32, float64, float16 or bfloat16, on the CPU. 16-bit
// gradients are unscaled in float32 and rounded back.
//
// Not thread-safe: one thread (per rank) at a time.
#include <concepts>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "dopt/actors/process_group.hpp"
#include "dopt/optim/optimizer.hpp"
#include "dopt/runtime/hyperparams.hpp"


namespace dopt::optim {


/// Whether any element of any defined tensor is inf or NaN (CPU, floating point).
bool has_nonfinite(const std::vector<Tensor>& tensors);
/// Collective over `group`: whether `local` is true on any rank (one MAX
/// all-reduce of one flag). An invalid group: `local` itself.
bool any_rank(bool local, ProcessGroup group);

struct GradScalerOptions {
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  std::int64_t growth_interval = 2000;
  /// false: scale() is the identity, step() steps, update() does nothing.
  bool enabled = true;
  /// Plain optimizers: the ranks that must agree on skipping (invalid: none).
  ProcessGroup process_group = {};
};

class GradScaler {
 public:
  /// ValueError for init_scale <= 0, growth_factor <= 1, backoff_factor
  /// outside (0, 1) or growth_interval < 1 (torch's checks).
  explicit GradScaler(GradScalerOptions options = {});

  /// loss * scale (what to backpropagate).
  double scale(double loss) const;
  /// The current scale (1 when disabled).
  double get_scale() const;
  bool is_enabled() const noexcept { return o_.enabled; }
  std::int64_t growth_tracker() const noexcept { return growth_tracker_; }

  /// Unscales the gradients the optimizer's step will read and records
  /// whether some are inf/NaN (agreed over the ranks, see the header).
  /// StateError when called twice in one iteration or after step().
  void unscale_(Optimizer& optimizer);
  /// An optimizer that optim does not know (ZeroRedundancyOptimizer,
  /// PostLocalSGDOptimizer, DistributedOptimizer of dopt/distributed/, whose
  /// headers say what each does): its header declares, in its own namespace,
  ///   void grad_scaler_unscale(GradScaler&, TheOptimizer&, Args...);
  /// found by argument-dependent lookup (optim depends on nothing above it).
  template <class T, class... A>
    requires requires(GradScaler& s, T& t, A&&... a) { grad_scaler_unscale(s, t, std::forward<A>(a)...); }
  void unscale_(T& optimizer, A&&... args) {
    grad_scaler_unscale(*this, optimizer, std::forward<A>(args)...);
  }

  /// Steps unless inf/NaN was found (on any rank); returns whether it
  /// stepped. StateError when called twice in one iteration.
  bool step(Optimizer& optimizer);
  /// An optimizer that optim does not know: its header declares
  ///   bool grad_scaler_step(GradScaler&, TheOptimizer&, Args...);
  template <class T, class... A>
    requires requires(GradScaler& s, T& t, A&&... a) {
      { grad_scaler_step(s, t, std::forward<A>(a)...) } -> std::convertible_to<bool>;
    }
  bool step(T& optimizer, A&&... args) {
    return grad_scaler_step(*this, optimizer, std::forward<A>(args)...);
  }

  /// Ends the iteration: back-off or growth (see the header); new_scale
  /// replaces the scale instead (> 0). StateError when no optimizer was
  /// unscaled or stepped since the last update.
  void update(std::optional<double> new_scale = std::nullopt);

  /// Whether the last step() of this iteration found inf/NaN (any optimizer).
  bool found_inf() const noexcept { return found_inf_any_; }

  /// torch's keys: scale, growth_factor, backoff_factor, growth_interval,
  /// _growth_tracker (empty when disabled, as torch).
  Hyperparams state_dict() const;
  /// KeyError for a missing key; an empty dict on an enabled scaler is a ValueError.
  void load_state_dict(const Hyperparams& sd);

  // --- the building blocks of grad_scaler_unscale / grad_scaler_step ---------
  // (for the optimizers of components above optim; `key` identifies the
  // optimizer within the iteration, e.g. its address).

  /// Unscales grads, agrees over group (any_rank), records the result for key.
  /// StateError when key was unscaled or stepped in this iteration.
  void unscale_grads(const void* key, const std::vector<Tensor>& grads, const ProcessGroup& group, const char* op);
  /// The same over the defined gradients of `groups`' parameters.
  void unscale_grads(const void* key, const std::vector<OptimizerParamGroup>& groups, const ProcessGroup& group,
                     const char* op);
  /// step's bookkeeping for key: disabled, do_step; else StateError when key
  /// stepped in this iteration, `unscale` when it was not unscaled, then
  /// do_skip when inf/NaN was found, else do_step. Returns whether it stepped.
  bool step_with(const void* key, const char* op, const std::function<void()>& do_step,
                 const std::function<void()>& do_skip, const std::function<void()>& unscale);
  /// Whether key was neither unscaled nor stepped in this iteration.
  bool untouched(const void* key) { return per_optimizer_[key].stage == Stage::ready; }

 private:
  enum class Stage { ready, unscaled, stepped };
  struct PerOptimizer {
    Stage stage = Stage::ready;
    bool found_inf = false;
  };
  PerOptimizer& state_for(const void* key, const char* op);
  template <class Step, class Skip>
  bool step_impl(const void* key, const char* op, Step&& do_step, Skip&& do_skip, const std::function<void()>& unscale);

  GradScalerOptions o_;
  float scale_;
  std::int64_t growth_tracker_ = 0;
  std::map<const void*, PerOptimizer> per_optimizer_;
  bool found_inf_any_ = false;
};

}  // namespace dopt::optim
