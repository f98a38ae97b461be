#pragma once
// DistributedOptimizer over dopt::rpc (torch.distributed.optim.DistributedOptimizer,
// docs/rpc.md).
//
//   // trainer (any worker):
//   std::vector<rpc::RRef<Tensor>> params = ...;   // owned by parameter-server workers
//   DistributedOptimizer opt(agent, OptimizerSpec{"Adam", {{"lr", 1e-3}}}, params);
//   rpc::GradContext ctx = agent.new_context();
//   ctx.deposit_all({{params[0], g0}, {params[1], g1}});   // backward's result
//   opt.step(ctx);                                          // one message per owner, all at once
//
// Contract
//   * Construction groups the parameters by owner and makes, on every owner
//     (one remote() per owner, the spec travelling as JSON), a local
//     functional optimizer (make_functional, so every registered class works)
//     over the owner's tensors themselves. It waits until every owner has
//     built it: a bad spec or a parameter that is not a float tensor fails
//     here (the owners' errors, type kept).
//   * step(ctx) waits for the context's deposits, then sends one message per
//     owner, all at once; each owner takes the context's gradients of its
//     parameters (context_grad) and runs its local optimizer's step. It
//     completes when every owner has applied its update, or fails with the
//     errors of every owner that failed, named (worker and rank), with the
//     type of the first failure (PeerLostError for a dead owner, at once;
//     TimeoutError after `timeout`).
//   * A parameter without a gradient in the context is skipped (no update,
//     no state), in that step only: no gradient is ever reused from an
//     earlier step or context (torch's Python path reapplies a stale .grad).
//   * Owners serialise steps: every worker runs at most one local-optimizer
//     step at a time (of any DistributedOptimizer, from any trainer), so
//     concurrent trainers on shared owners lose no update; the order of two
//     trainers' steps is the order their messages arrive.
//   * The result equals, bit for bit, the local optimizer class applying the
//     same gradients (functional.hpp's contract).
//   * Beyond torch: zero_grad(ctx) drops the context's gradients of these
//     parameters on every owner; set_lr / set_hyperparameters change the
//     local optimizers on every owner (all at once, returns when all have);
//     every learning-rate scheduler of lr_scheduler.hpp drives them (one
//     round of messages per scheduler step); DistributedLambdaLR below is
//     the older LambdaLR-only form.
//   * The object is used by one thread at a time; its calls may overlap with
//     other trainers' calls on the same owners.
#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "dopt/actors/rpc.hpp"
#include "dopt/optim/registry.hpp"

namespace dopt::optim {

struct DistributedOptimizerOptions {
  /// Deadline of each message to the owners; empty: the agent's rpc_timeout.
  std::optional<std::chrono::milliseconds> timeout;
  /// Resends of each message after its deadline (same call id: an owner
  /// applies a step at most once, rpc.hpp's idempotency).
  int retries = 0;
};

/// The value each owner keeps (local functional optimizer + its parameters).
struct OwnerOptimizer {
  std::unique_ptr<FunctionalOptimizer> optimizer;
  std::vector<rpc::RRef<Tensor>> params;
  std::vector<std::uint64_t> ids;
  long steps = 0;
};

class DistributedOptimizer {
 public:
  DistributedOptimizer(rpc::Agent agent, OptimizerSpec spec, const std::vector<rpc::RRef<Tensor>>& params,
                       DistributedOptimizerOptions options = {});
  /// Typed options instead of a spec: DistributedOptimizer(agent,
  /// AdamOptions(1e-3), params) is DistributedOptimizer(agent, spec_of(AdamOptions(1e-3)), params).
  DistributedOptimizer(rpc::Agent agent, const OptimizerOptions& optimizer,
                       const std::vector<rpc::RRef<Tensor>>& params, DistributedOptimizerOptions options = {});

  /// One step on every owner with the gradients of ctx (see the header).
  void step(const rpc::GradContext& ctx);
  Future<void> step_async(const rpc::GradContext& ctx);
  /// The same for a context id (e.g. one made by another worker).
  Future<void> step_async(std::uint64_t context_id);

  /// Drops ctx's gradients of these parameters on every owner.
  void zero_grad(const rpc::GradContext& ctx);
  /// Sets the learning rate of every owner's local optimizer.
  void set_lr(double lr);
  /// Overwrites hyperparameters on every owner (validated there; invalid
  /// values change nothing on that owner and fail the call).
  void set_hyperparameters(const Hyperparams& h);
  /// Every owner's learning rate, in owners() order.
  std::vector<double> lrs() const;

  /// The hyperparameters this object last gave the owners (every key, the
  /// class's defaults filled in), plus staged ones; local, no message.
  const Hyperparams& hyperparameters() const noexcept { return hyper_; }
  /// Changes hyperparameters here only; commit_hyperparameters() sends every
  /// staged key to every owner in one round (how schedulers reach the
  /// owners: lr_scheduler.hpp). set_lr / set_hyperparameters stage and commit.
  void stage_hyperparameters(const Hyperparams& h);
  /// Sends the staged keys (nothing to do when none are staged). On failure
  /// they stay staged and the error is thrown.
  void commit_hyperparameters();
  /// torch's param_group['initial_lr'] of the one group (schedulers).
  std::optional<double>& initial_lr() noexcept { return initial_lr_; }

  /// The owners, by rank.
  std::vector<rpc::WorkerInfo> owners() const;
  const OptimizerSpec& spec() const noexcept { return spec_; }
  std::size_t num_params() const noexcept { return num_params_; }

  /// Registers the owner-side functions ("dopt.optim.*"). Idempotent; runs
  /// at static initialisation of any program that links this file, and from
  /// the constructor.
  static void register_functions();

 private:
  struct Owner {
    int rank = -1;
    rpc::RRef<OwnerOptimizer> local;
  };
  /// Sends method(args...) to every owner at once; joins the results.
  template <class... A>
  Future<void> fan_out(const std::string& what, const std::string& method, const A&... args) const;

  rpc::Agent agent_;
  OptimizerSpec spec_;
  DistributedOptimizerOptions options_;
  std::vector<Owner> owners_;
  std::size_t num_params_ = 0;
  Hyperparams hyper_;
  Hyperparams staged_;
  std::optional<double> initial_lr_;
};

/// torch's LambdaLR over a DistributedOptimizer: lr = base_lr * lambda(epoch)
/// on every owner; the constructor sets epoch 0, step() advances.
class DistributedLambdaLR {
 public:
  DistributedLambdaLR(DistributedOptimizer& opt, std::function<double(int)> lambda);
  void step();
  int last_epoch() const noexcept { return epoch_; }
  double last_lr() const noexcept { return last_lr_; }

 private:
  DistributedOptimizer& opt_;
  std::function<double(int)> lambda_;
  double base_lr_;
  int epoch_ = 0;
  double last_lr_ = 0;
};

namespace detail {
/// Testing: called on the owner at the start of every owner step, with the
/// step count of that owner's local optimizer (e.g. to kill the worker mid-step).
void set_owner_step_hook(std::function<void(rpc::Agent&, long step)> hook);
}  // namespace detail

}  // namespace dopt::optim
