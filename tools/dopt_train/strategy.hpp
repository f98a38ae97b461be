#pragma once
// dopt-train's distributed optimizer strategies: how one rank turns its local
// gradients into a parameter update. One class per --optim mode:
//
//   zero            Reducer (DDP gradient averaging) + ZeroRedundancyOptimizer
//                   (each rank keeps the optimizer state of its shard only);
//                   --zero-stage 3: ShardedUnits, one unit per layer, which
//                   the model gathers layer by layer (strategy_stage3.cpp)
//   ddp             Reducer + a full local optimizer on every rank
//   post-local-sgd  Reducer with post_localSGD_hook + PostLocalSGDOptimizer:
//                   global averaging for --plsgd-warmup steps, then local steps
//                   with the parameters averaged every --plsgd-period steps
//   diloco          PostLocalSGDOptimizer + DiLoCoAverager: local steps only;
//                   every --diloco-sync-every steps the pseudo-gradients are
//                   averaged (in --diloco-fragments fragments, in the
//                   --diloco-wire format) and an outer Nesterov SGD steps
//   remote          DistributedOptimizer with parameter owners (when built in)
//
// Per step, on every rank: grad_ready(p) for each parameter as the backward
// pass produces it, then finish_step(). Every call except state_bytes() and
// owned_numel() may be a collective over the world: all ranks make the same
// calls in the same order.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dopt/actors/process_group.hpp"
#include "dopt/distributed/checkpointer.hpp"
#include "dopt/optim/optimizer.hpp"
#include "dopt/optim/registry.hpp"
#include "dopt/runtime/tensor.hpp"

namespace dopt_train {

using dopt::Tensor;
struct LayerSource;  // model.hpp

struct StrategyConfig {
  std::string mode;                  // zero | ddp | post-local-sgd | remote
  dopt::optim::OptimizerSpec inner;  // the local optimizer
  std::int64_t plsgd_warmup = 20;
  std::int64_t plsgd_period = 4;
  int plsgd_local_group = 1;  // 1: purely local gradients after warm-up
  // diloco
  std::int64_t diloco_sync_every = 50;
  int diloco_fragments = 1;  // contiguous runs of the parameter list
  std::int64_t diloco_delay = 0;
  double diloco_alpha = 0.0;
  double diloco_outer_lr = 0.7;
  double diloco_outer_momentum = 0.9;
  std::string diloco_wire = "float32";
  bool diloco_error_feedback = false;
  /// --survive (zero, ddp): the strategy goes on over the survivors when a
  /// rank is lost (docs/fault-tolerance-tools.md). Its groups are its own lines
  /// (new_group over the world's ranks), apart from the training loop's world.
  bool survive = false;
  /// --survive-buddies host_memory (zero): ZeroBuddyUpdate::host_memory
  /// (the shard in shared memory its buddies map, with parameter buckets).
  bool survive_host_memory = false;
  /// --zero-stage (zero): 1, or 2: the reducer keeps only the owned
  /// parameters' averaged gradients (zero_stage2_options, docs/zero-stage2-3.md).
  int zero_stage = 1;
};

class Strategy {
 public:
  virtual ~Strategy() = default;
  /// "ZeRO(Adam)", ...
  virtual std::string describe() const = 0;
  /// p's gradient (p.grad()) is final for this step.
  virtual void grad_ready(const Tensor& p) = 0;
  /// Averages what is left and updates the parameters.
  virtual void finish_step() = 0;
  /// Bytes of optimizer state this rank holds now.
  virtual std::int64_t state_bytes() const = 0;
  /// Parameter elements whose optimizer state this rank holds.
  virtual std::int64_t owned_numel() const = 0;
  /// Bytes of gradients this rank holds between steps, by the library's
  /// accounting (Reducer::gradient_bytes: the gradients and the buckets; in
  /// ZeRO stage 2 the owned gradients and one bucket); -1: only the
  /// parameters' own gradients (the caller counts them).
  virtual std::int64_t gradient_bytes() const { return -1; }
  /// Bytes of parameters this rank holds between steps; -1: the model's.
  virtual std::int64_t param_bytes() const { return -1; }
  /// ZeRO stage 3: where the model takes each layer's parameters from (the
  /// model then holds none, Mlp::release_params); null: the model's own.
  virtual LayerSource* layer_source() { return nullptr; }
  /// With a layer_source: collective, the full parameters in the model's
  /// order (--dump-params).
  virtual std::vector<Tensor> full_params() { return {}; }
  /// With a layer_source: the parameters this rank holds and their names
  /// (the non-finite check).
  virtual std::vector<Tensor> local_params() const { return {}; }
  virtual std::vector<std::string> local_param_names() const { return {}; }
  /// Local: registers what a checkpoint of this strategy holds with ckpt:
  /// `params` as the item "model" (replicated where every rank holds the
  /// same parameters, zero and ddp; per rank otherwise), finite values only,
  /// then the optimizer state as "optim" (ZeRO's shards; DDP's optimizer,
  /// replicated; post-local SGD's and DiLoCo's, per rank).
  virtual void add_to(dopt::Checkpointer& ckpt, const std::map<std::string, Tensor>& params) = 0;
  /// Local: a checkpoint of `step` was loaded into what add_to registered;
  /// sets what follows from the step alone (post-local SGD's hook counts
  /// its warm-up itself).
  virtual void resumed(std::int64_t /*step*/) {}
  /// The current learning rate.
  virtual double lr() const = 0;
  /// Bytes this rank has sent for the optimizer's communication since the
  /// strategy was built: a ring all-reduce of B bytes over n ranks counts
  /// 2 (n - 1) / n * B (what the ring algorithm sends per rank); DiLoCo's
  /// quantized formats count their exact payload. Local.
  virtual std::uint64_t bytes_sent() const = 0;

  /// --survive. A rank was lost after finish_step() last recovered (the
  /// trainer noticed it in its own collectives, and take_lost() was empty):
  /// a collective of the survivors, between steps, that brings the
  /// strategy's groups over to them. Nothing when not survive.
  virtual void recover() {}
  /// --survive: the lost ranks (global) that finish_step() or recover()
  /// recovered from since the last call, and clears them.
  virtual std::vector<int> take_lost() { return {}; }
  /// --survive under dopt-run --on-failure replace: whether grow_strategy()
  /// can rebuild this strategy over a grown group (a catch-up exists for it).
  /// Local.
  virtual bool can_grow() const { return false; }
};

/// The modes that can run with --survive.
bool mode_survives(const std::string& mode);

/// The modes this build offers (remote only when the RPC layer is built in).
std::vector<std::string> available_modes();
/// Whether `mode` is built in; when not, why (a message for the user).
bool mode_available(const std::string& mode, std::string* why);

/// Builds the strategy of cfg.mode over params (a collective: the reducer
/// broadcasts the parameters from rank 0).
/// Bytes of the defined tensors of an optimizer's state; of a list of tensors.
std::int64_t optimizer_state_bytes(const dopt::optim::Optimizer& opt);
std::int64_t nbytes_of(const std::vector<Tensor>& ps);

/// --optim zero --zero-stage 3 (strategy_stage3.cpp): params are the
/// model's, weight and bias of each layer in turn; each layer is a unit.
std::unique_ptr<Strategy> make_zero_stage3(const StrategyConfig& cfg, const std::vector<Tensor>& params,
                                           dopt::ProcessGroup world);
std::unique_ptr<Strategy> make_strategy(const StrategyConfig& cfg, const std::vector<Tensor>& params,
                                        dopt::ProcessGroup world);

/// Whether a strategy of cfg can take a replacement of a lost rank (--survive,
/// zero stage 1 with buddies that step); when not, why (a usage message
/// naming the option). Local.
bool config_grows(const StrategyConfig& cfg, std::string* why);

/// Growing back (--survive under dopt-run --on-failure replace;
/// docs/fault-tolerance-tools.md, "dopt-train --survive"): cfg's strategy over
/// grown.group, brought to where the members' strategy stands (ZeRO:
/// zero_catch_up: the optimizer state to its new owners, the parameters,
/// hyperparameters and step count to the newcomers). Collective over
/// grown.group, on the rank thread, at one step boundary: every member
/// passes its strategy over the old group as `before` (spent afterwards:
/// destroy it, never step it), every newcomer null. The new strategy runs
/// over grown.group itself (a grown group makes no lines of its own), so it
/// does not survive a later loss; it grows again (can_grow(): the newcomers
/// of an elastic job join one at a time). NotSupportedError when
/// config_grows(cfg) is false.
std::unique_ptr<Strategy> grow_strategy(const StrategyConfig& cfg, const std::vector<Tensor>& params,
                                        const dopt::GrowResult& grown, Strategy* before);

}  // namespace dopt_train
