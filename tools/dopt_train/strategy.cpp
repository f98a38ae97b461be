#include "strategy.hpp"

#include <algorithm>
#include <functional>
#include <utility>

#include "dopt/distributed/averagers.hpp"
#include "dopt/distributed/comm_hooks.hpp"
#include "dopt/distributed/diloco.hpp"
#include "dopt/distributed/post_local_sgd.hpp"
#include "dopt/distributed/reducer.hpp"
#include "dopt/distributed/zero.hpp"
#include "dopt/runtime/error.hpp"

namespace dopt_train {

using namespace dopt::optim;

std::int64_t optimizer_state_bytes(const Optimizer& opt) {
  std::int64_t b = 0;
  for (const auto& [k, st] : opt.state())
    for (const auto& [name, t] : st)
      if (t.defined()) b += static_cast<std::int64_t>(t.nbytes());
  return b;
}

std::int64_t nbytes_of(const std::vector<Tensor>& ps) {
  std::int64_t n = 0;
  for (const Tensor& p : ps) n += static_cast<std::int64_t>(p.nbytes());
  return n;
}

namespace {

std::int64_t numel_of(const std::vector<Tensor>& ps) {
  std::int64_t n = 0;
  for (const Tensor& p : ps) n += p.numel();
  return n;
}



/// The parameters as a checkpoint's item "model" (Strategy::add_to).
void add_params(dopt::Checkpointer& ckpt, const std::map<std::string, Tensor>& params, dopt::Placement placement) {
  ckpt.add_tensors("model", params, placement, dopt::TensorValues::finite);
}

/// What a ring all-reduce of `bytes` over n ranks sends per rank.
std::uint64_t ring_bytes(std::int64_t bytes, int n) {
  return n <= 1 ? 0 : static_cast<std::uint64_t>(bytes) * 2 * static_cast<std::uint64_t>(n - 1) / static_cast<std::uint64_t>(n);
}

/// --survive: the global ranks of `group` that `rec` lost.
std::vector<int> lost_globals(const std::vector<int>& before, const ZeroRecovery& rec) {
  std::vector<int> out;
  for (int r : rec.lost) out.push_back(before[static_cast<std::size_t>(r)]);
  return out;
}

/// --survive: a group of its own over the world's ranks (a world collective),
/// so that the strategy's recovery and the training loop's never shrink the
/// same group twice.
dopt::ProcessGroup own_line(dopt::ProcessGroup world, bool survive) {
  return survive ? world.new_group(world.ranks()) : world;
}

ReducerOptions reducer_options(bool survive, std::function<void(const ZeroRecovery&)> cb) {
  ReducerOptions ro;
  ro.survive = survive;
  if (survive) ro.on_membership_change = std::move(cb);
  return ro;
}

/// Adds the global ranks `lost` to `into` (sorted, once each).
void note_lost(std::vector<int>& into, const std::vector<int>& lost) {
  for (int r : lost)
    if (std::find(into.begin(), into.end(), r) == into.end()) into.push_back(r);
  std::sort(into.begin(), into.end());
}

/// zero: gradients averaged by the reducer, then ZeRO's sharded step.
/// --survive: ZeRO with redundancy 1; the reducer and ZeRO recover by
/// themselves inside finish_step() (callbacks), each over its own group.
/// --zero-stage 2: the reducer reduces each gradient onto its owner only
/// (main() refuses it with --survive).
class ZeroStrategy : public Strategy {
 public:
  static ZeroOptions zero_options(dopt::ProcessGroup g, bool survive, bool host_memory,
                                  std::function<void(const ZeroRecovery&)> cb) {
    ZeroOptions zo{std::move(g)};
    if (survive) {
      zo.redundancy = 1;
      zo.on_membership_change = std::move(cb);
      if (host_memory) {
        zo.buddy_update = ZeroBuddyUpdate::host_memory;
        zo.parameters_as_bucket_view = true;
      }
    }
    return zo;
  }
  ZeroStrategy(const StrategyConfig& cfg, const std::vector<Tensor>& params, dopt::ProcessGroup world)
      : survive_(cfg.survive),
        stage_(cfg.zero_stage),
        zero_(params, cfg.inner,
              zero_options(own_line(world, cfg.survive), cfg.survive, cfg.survive_host_memory,
                           [this](const ZeroRecovery& r) { on_change(r, zero_ranks_); })),
        reducer_(params, own_line(world, cfg.survive),
                 stage_ == 2 ? zero_stage2_options(zero_, params)
                             : reducer_options(cfg.survive,
                                               [this](const ZeroRecovery& r) { on_change(r, reducer_ranks_); })),
        reducer_ranks_(reducer_.process_group().ranks()), zero_ranks_(zero_.process_group().ranks()),
        // stage 2 reduces each gradient onto its owner: counted as half a ring all-reduce
        per_step_((stage_ == 2 ? ring_bytes(nbytes_of(params), world.size()) / 2
                               : ring_bytes(nbytes_of(params), world.size())) +
                  (world.size() > 1 ? static_cast<std::uint64_t>(nbytes_of(params)) *
                                          static_cast<std::uint64_t>(world.size() - 1) /
                                          static_cast<std::uint64_t>(world.size())
                                    : 0)) {}
  std::string describe() const override {
    return "ZeRO(" + zero_.optim().name() + ")" + (stage_ == 2 ? ", stage 2" : "") +
           (survive_ ? (zero_.buddy_update() == ZeroBuddyUpdate::host_memory ? ", redundancy 1 (host memory)"
                                                                              : ", redundancy 1")
                     : "");
  }
  void grad_ready(const Tensor& p) override { reducer_.mark_ready(p); }
  void finish_step() override {
    reducer_.finalize();
    zero_.step();
    sent_ += per_step_;
  }
  void recover() override {
    if (!survive_) return;
    on_change(reducer_.recover(), reducer_ranks_);
    on_change(zero_.recover(), zero_ranks_);  // ShardLostError when a shard is gone
  }
  std::vector<int> take_lost() override { return std::exchange(lost_, {}); }
  bool can_grow() const override {
    return (survive_ || grown_) && stage_ == 1 && zero_.buddy_update() != ZeroBuddyUpdate::host_memory;
  }
  /// A strategy that grow_strategy() made grows again (newcomers of an
  /// elastic job join one at a time), though it survives no loss.
  void set_grown() { grown_ = true; }
  /// grow_strategy(): this strategy, over grown.group, catches up from
  /// `before` (a member's, over the old group) or as a newcomer (null).
  void catch_up(ZeroStrategy* before, const dopt::GrowResult& grown) {
    zero_catch_up(zero_, before ? &before->zero_ : nullptr, grown);
  }
  /// The gradient all-reduce plus the parameters' broadcast from their owners
  /// (counted as a ring all-gather: (n - 1) / n of the parameters).
  std::uint64_t bytes_sent() const override { return sent_; }
  std::int64_t state_bytes() const override { return zero_.local_state_bytes(); }
  std::int64_t gradient_bytes() const override { return reducer_.gradient_bytes(); }
  std::int64_t owned_numel() const override {
    std::int64_t n = 0;
    for (const auto& group : zero_.partition()[static_cast<std::size_t>(zero_.rank())]) n += numel_of(group);
    return n;
  }
  void add_to(dopt::Checkpointer& ckpt, const std::map<std::string, Tensor>& params) override {
    add_params(ckpt, params, dopt::Placement::replicated);
    ckpt.add_optimizer("optim", zero_);
  }
  double lr() const override { return zero_.param_groups()[0].options->get_lr(); }

 private:
  void on_change(const ZeroRecovery& r, std::vector<int>& ranks) {
    note_lost(lost_, lost_globals(ranks, r));
    ranks = r.group.ranks();
  }
  bool survive_;
  bool grown_ = false;  // made by grow_strategy()
  int stage_;
  ZeroRedundancyOptimizer zero_;  // before reducer_: stage 2's reducer takes its partition
  Reducer reducer_;
  std::vector<int> reducer_ranks_, zero_ranks_, lost_;
  std::uint64_t per_step_ = 0, sent_ = 0;
};

/// ddp: gradients averaged by the reducer, every rank steps a full optimizer.
/// --survive: the reducer recovers inside finish_step() (the step's gradients
/// averaged again over the survivors), then the local step.
class DdpStrategy : public Strategy {
 public:
  DdpStrategy(const StrategyConfig& cfg, const std::vector<Tensor>& params, dopt::ProcessGroup world)
      : survive_(cfg.survive),
        reducer_(params, own_line(world, cfg.survive),
                 reducer_options(cfg.survive, [this](const ZeroRecovery& r) { on_change(r); })),
        ranks_(reducer_.process_group().ranks()),
        opt_(make_optimizer(cfg.inner, {OptimizerParamGroup(params)})),
        per_step_(ring_bytes(nbytes_of(params), world.size())) {}
  std::string describe() const override { return "DDP(" + opt_->name() + ")"; }
  void grad_ready(const Tensor& p) override { reducer_.mark_ready(p); }
  void finish_step() override {
    reducer_.finalize();
    opt_->step();
    sent_ += per_step_;
  }
  std::uint64_t bytes_sent() const override { return sent_; }
  std::int64_t state_bytes() const override { return optimizer_state_bytes(*opt_); }
  std::int64_t gradient_bytes() const override { return reducer_.gradient_bytes(); }
  std::int64_t owned_numel() const override { return numel_of(opt_->all_params()); }
  void add_to(dopt::Checkpointer& ckpt, const std::map<std::string, Tensor>& params) override {
    add_params(ckpt, params, dopt::Placement::replicated);
    ckpt.add_optimizer("optim", *opt_, dopt::Placement::replicated);  // the same averaged gradients on every rank
  }
  double lr() const override { return opt_->param_groups()[0].options->get_lr(); }
  void recover() override {
    if (survive_) on_change(reducer_.recover());
  }
  std::vector<int> take_lost() override { return std::exchange(lost_, {}); }

 private:
  void on_change(const ZeroRecovery& r) {
    note_lost(lost_, lost_globals(ranks_, r));
    ranks_ = r.group.ranks();
    per_step_ = ring_bytes(nbytes_of(opt_->all_params()), r.group.size());
  }
  bool survive_;
  Reducer reducer_;
  std::vector<int> ranks_, lost_;
  std::unique_ptr<Optimizer> opt_;
  std::uint64_t per_step_ = 0, sent_ = 0;
};

/// post-local-sgd: the reducer's post_localSGD_hook averages gradients
/// globally during warm-up, then (local group 1) not at all or within blocks
/// of ranks; PostLocalSGDOptimizer's averager averages the parameters every
/// period steps after warm-up.
class PostLocalSgdStrategy : public Strategy {
 public:
  PostLocalSgdStrategy(const StrategyConfig& cfg, const std::vector<Tensor>& params, dopt::ProcessGroup world)
      : reducer_(params, world) {
    PostLocalSGDConfig pc{world};
    pc.start_localSGD_iter = cfg.plsgd_warmup;
    pc.period = cfg.plsgd_period;
    if (cfg.plsgd_local_group <= 1) pc.post_local_gradient_allreduce = false;
    else pc.subgroup = world.new_subgroups(cfg.plsgd_local_group).current;  // world collective
    hook_state_ = pc.make_hook_state();
    reducer_.register_comm_hook(post_localSGD_hook(hook_state_));
    opt_ = std::make_unique<PostLocalSGDOptimizer>(make_optimizer(cfg.inner, {OptimizerParamGroup(params)}),
                                                   pc.make_averager(), *hook_state_);
    warmup_ = cfg.plsgd_warmup;
    period_ = cfg.plsgd_period;
    grad_global_ = ring_bytes(nbytes_of(params), world.size());
    grad_local_ = cfg.plsgd_local_group <= 1 ? 0 : ring_bytes(nbytes_of(params), cfg.plsgd_local_group);
    params_ = grad_global_;
  }
  std::string describe() const override {
    return "PostLocalSGD(" + opt_->optim().name() + ", warm-up " + std::to_string(warmup_) + ", period " +
           std::to_string(period_) + ")";
  }
  void grad_ready(const Tensor& p) override { reducer_.mark_ready(p); }
  void finish_step() override {
    const bool averages = opt_->averager().will_average();
    const bool warm = steps_++ < warmup_;
    reducer_.finalize();
    opt_->step();
    sent_ += (warm ? grad_global_ : grad_local_) + (averages ? params_ : 0);
  }
  /// Gradients: all-reduced over the world during warm-up, then over the
  /// local group; parameters: all-reduced on the averager's steps.
  std::uint64_t bytes_sent() const override { return sent_; }
  std::int64_t state_bytes() const override { return optimizer_state_bytes(opt_->optim()); }
  std::int64_t gradient_bytes() const override { return reducer_.gradient_bytes(); }
  std::int64_t owned_numel() const override { return numel_of(opt_->optim().all_params()); }
  /// The parameters differ between the ranks' averagings: per rank.
  void add_to(dopt::Checkpointer& ckpt, const std::map<std::string, Tensor>& params) override {
    add_params(ckpt, params, dopt::Placement::per_rank);
    ckpt.add_optimizer("optim", *opt_);
  }
  void resumed(std::int64_t step) override {
    // The hook counts warm-up iterations itself (it stops at start_localSGD_iter).
    hook_state_->iter = std::min(step, hook_state_->start_localSGD_iter);
    steps_ = step;
  }
  double lr() const override { return opt_->param_groups()[0].options->get_lr(); }

 private:
  Reducer reducer_;
  std::shared_ptr<PostLocalSGDState> hook_state_;
  std::unique_ptr<PostLocalSGDOptimizer> opt_;
  std::int64_t warmup_ = 0, period_ = 1;
  std::uint64_t grad_global_ = 0, grad_local_ = 0, params_ = 0, sent_ = 0;
  std::int64_t steps_ = 0;
};

/// diloco: no gradient communication at all; PostLocalSGDOptimizer's
/// DiLoCoAverager synchronises the parameters through the outer optimizer.
class DiLoCoStrategy : public Strategy {
 public:
  DiLoCoStrategy(const StrategyConfig& cfg, const std::vector<Tensor>& params, dopt::ProcessGroup world) {
    // The same initial parameters on every rank (the reducers of the other
    // modes broadcast them; here it is done once, explicitly).
    world.broadcast_coalesced(params, 0);
    DiLoCoOptions o;
    o.sync_every = cfg.diloco_sync_every;
    const auto F = static_cast<std::size_t>(std::max(1, cfg.diloco_fragments));
    if (F > params.size())
      throw dopt::ValueError("dopt-train", "--diloco-fragments " + std::to_string(F) + " exceeds the " +
                                               std::to_string(params.size()) + " parameter tensors of the model");
    for (std::size_t k = 0; k < F; ++k) {
      std::vector<std::int64_t> frag;
      for (std::size_t i = params.size() * k / F; i < params.size() * (k + 1) / F; ++i)
        frag.push_back(static_cast<std::int64_t>(i));
      o.fragments.push_back(std::move(frag));
    }
    o.fragment_sync_delay = cfg.diloco_delay;
    o.fragment_update_alpha = cfg.diloco_alpha;
    o.outer_optimizer = {"SGD", {{"lr", cfg.diloco_outer_lr}, {"momentum", cfg.diloco_outer_momentum},
                                 {"nesterov", cfg.diloco_outer_momentum > 0}}};
    o.wire_format = parse_wire_format(cfg.diloco_wire);
    o.error_feedback = cfg.diloco_error_feedback;
    auto averager = std::make_unique<DiLoCoAverager>(params, o, world);
    diloco_ = averager.get();
    opt_ = std::make_unique<PostLocalSGDOptimizer>(make_optimizer(cfg.inner, {OptimizerParamGroup(params)}),
                                                   std::move(averager));
  }
  std::string describe() const override {
    const auto& o = diloco_->options();
    return "DiLoCo(" + opt_->optim().name() + ", sync every " + std::to_string(o.sync_every) + ", " +
           std::to_string(diloco_->fragments().size()) + " fragment(s), delay " +
           std::to_string(o.fragment_sync_delay) + ", " + std::string(wire_format_name(o.wire_format)) +
           (o.error_feedback ? " + error feedback" : "") + ")";
  }
  void grad_ready(const Tensor&) override {}
  void finish_step() override { opt_->step(); }
  std::uint64_t bytes_sent() const override { return diloco_->stats().bytes_sent; }
  std::int64_t state_bytes() const override {
    // The inner optimizer's state plus the anchors and the outer state.
    std::int64_t b = optimizer_state_bytes(opt_->optim()) + nbytes_of(diloco_->anchors());
    for (std::size_t k = 0; k < diloco_->fragments().size(); ++k) b += optimizer_state_bytes(diloco_->outer_optimizer(k));
    return b;
  }
  std::int64_t owned_numel() const override { return numel_of(opt_->optim().all_params()); }
  /// Per rank, like post-local SGD's; the averager's anchors and outer state,
  /// the same on every rank, go to its own shards (the Checkpointer turns
  /// DiLoCo's sharded checkpoints on).
  void add_to(dopt::Checkpointer& ckpt, const std::map<std::string, Tensor>& params) override {
    add_params(ckpt, params, dopt::Placement::per_rank);
    ckpt.add_optimizer("optim", *opt_);
  }
  double lr() const override { return opt_->param_groups()[0].options->get_lr(); }

 private:
  std::unique_ptr<PostLocalSGDOptimizer> opt_;
  DiLoCoAverager* diloco_ = nullptr;
};

}  // namespace

bool mode_survives(const std::string& mode) { return mode == "zero" || mode == "ddp"; }

std::vector<std::string> available_modes() { return {"zero", "post-local-sgd", "ddp", "diloco", "remote"}; }

bool mode_available(const std::string& mode, std::string* why) {
  if (mode == "remote") {
#ifdef DOPT_TRAIN_HAVE_REMOTE
    return true;  // remote.cpp: not a Strategy (it runs over dopt::rpc, without a process group)
#endif
    if (why)
      *why = "--optim remote (DistributedOptimizer with parameter owners) is not available in this build: "
             "dopt's RPC layer (dopt/actors/rpc.hpp, dopt/distributed/distributed_optimizer.hpp) is not built in yet; "
             "use --optim zero, ddp or post-local-sgd";
    return false;
  }
  return mode == "zero" || mode == "ddp" || mode == "post-local-sgd" || mode == "diloco";
}

bool config_grows(const StrategyConfig& cfg, std::string* why) {
  std::string w;
  if (!cfg.survive)
    w = "a replacement of a lost rank (dopt-run --on-failure replace) joins only a run with --survive";
  else if (cfg.mode != "zero")
    w = "--optim " + cfg.mode + " --survive cannot take a replacement of a lost rank yet (there is no catch-up for "
        "its optimizer; --optim zero has one): run it under dopt-run --on-failure continue";
  else if (cfg.survive_host_memory)
    w = "--survive-buddies host_memory cannot take a replacement of a lost rank yet (zero_catch_up does not "
        "rebuild shards in host memory): use --survive-buddies step, or dopt-run --on-failure continue";
  else if (cfg.zero_stage != 1)
    w = "--zero-stage " + std::to_string(cfg.zero_stage) + " cannot take a replacement of a lost rank";
  if (why) *why = w;
  return w.empty();
}

std::unique_ptr<Strategy> grow_strategy(const StrategyConfig& cfg, const std::vector<Tensor>& params,
                                        const dopt::GrowResult& grown, Strategy* before) {
  std::string why;
  if (!config_grows(cfg, &why) || (before && !before->can_grow()))
    throw dopt::NotSupportedError("dopt-train --survive", why.empty() ? "this strategy cannot grow back" : why,
                                  grown.group.rank());
  auto* old = dynamic_cast<ZeroStrategy*>(before);
  // Over grown.group itself: no lines of its own (own_line), no recovery.
  StrategyConfig over = cfg;
  over.survive = false;
  over.survive_host_memory = false;
  auto grown_strategy = std::make_unique<ZeroStrategy>(over, params, grown.group);
  grown_strategy->catch_up(old, grown);
  grown_strategy->set_grown();
  return grown_strategy;
}

std::unique_ptr<Strategy> make_strategy(const StrategyConfig& cfg, const std::vector<Tensor>& params,
                                        dopt::ProcessGroup world) {
  std::string why;
  if (!mode_available(cfg.mode, &why)) throw dopt::NotSupportedError("dopt-train", why);
  if (cfg.mode == "remote") throw dopt::NotSupportedError("dopt-train", "--optim remote runs run_remote(), not a Strategy");
  if (cfg.mode == "zero" && cfg.zero_stage == 3) return make_zero_stage3(cfg, params, world);
  if (cfg.mode == "zero") return std::make_unique<ZeroStrategy>(cfg, params, world);
  if (cfg.mode == "ddp") return std::make_unique<DdpStrategy>(cfg, params, world);
  if (cfg.mode == "diloco") return std::make_unique<DiLoCoStrategy>(cfg, params, world);
  return std::make_unique<PostLocalSgdStrategy>(cfg, params, world);
}

}  // namespace dopt_train
