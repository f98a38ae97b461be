#include "strategy.hpp"

#include <algorithm>
#include <filesystem>

#include "dopt/optim/averagers.hpp"
#include "dopt/optim/comm_hooks.hpp"
#include "dopt/optim/post_local_sgd.hpp"
#include "dopt/optim/reducer.hpp"
#include "dopt/optim/zero.hpp"
#include "dopt/runtime/error.hpp"
#include "dopt/runtime/state_dict.hpp"

namespace dopt_train {

namespace fs = std::filesystem;
using namespace dopt::optim;

namespace {

std::int64_t optimizer_state_bytes(const Optimizer& opt) {
  std::int64_t b = 0;
  for (const auto& [k, st] : opt.state())
    for (const auto& [name, t] : st)
      if (t.defined()) b += static_cast<std::int64_t>(t.nbytes());
  return b;
}

std::int64_t numel_of(const std::vector<Tensor>& ps) {
  std::int64_t n = 0;
  for (const Tensor& p : ps) n += p.numel();
  return n;
}

/// zero: gradients averaged by the reducer, then ZeRO's sharded step.
class ZeroStrategy : public Strategy {
 public:
  ZeroStrategy(const StrategyConfig& cfg, const std::vector<Tensor>& params, dopt::ProcessGroup world)
      : reducer_(params, world), zero_(params, cfg.inner, ZeroOptions{world}) {}
  std::string describe() const override { return "ZeRO(" + zero_.optim().name() + ")"; }
  void grad_ready(const Tensor& p) override { reducer_.mark_ready(p); }
  void finish_step() override {
    reducer_.finalize();
    zero_.step();
  }
  std::int64_t state_bytes() const override { return zero_.local_state_bytes(); }
  std::int64_t owned_numel() const override {
    std::int64_t n = 0;
    for (const auto& group : zero_.partition()[static_cast<std::size_t>(zero_.rank())]) n += numel_of(group);
    return n;
  }
  void save(const std::string& dir) override { zero_.save_sharded(dir); }
  void load(const std::string& dir, std::int64_t) override { zero_.load_sharded(dir); }
  double lr() const override { return zero_.param_groups()[0].options->get_lr(); }

 private:
  Reducer reducer_;
  ZeroRedundancyOptimizer zero_;
};

/// ddp: gradients averaged by the reducer, every rank steps a full optimizer.
class DdpStrategy : public Strategy {
 public:
  DdpStrategy(const StrategyConfig& cfg, const std::vector<Tensor>& params, dopt::ProcessGroup world)
      : reducer_(params, world), opt_(make_optimizer(cfg.inner, {OptimizerParamGroup(params)})),
        rank_(world.rank()), world_size_(world.size()) {}
  std::string describe() const override { return "DDP(" + opt_->name() + ")"; }
  void grad_ready(const Tensor& p) override { reducer_.mark_ready(p); }
  void finish_step() override {
    reducer_.finalize();
    opt_->step();
  }
  std::int64_t state_bytes() const override { return optimizer_state_bytes(*opt_); }
  std::int64_t owned_numel() const override { return numel_of(opt_->all_params()); }
  void save(const std::string& dir) override {
    dopt::save_state_dict(opt_->state_dict(), (fs::path(dir) / optim_file_name(rank_, world_size_)).string());
  }
  void load(const std::string& dir, std::int64_t) override {
    opt_->load_state_dict(dopt::load_state_dict((fs::path(dir) / optim_file_name(rank_, world_size_)).string()));
  }
  double lr() const override { return opt_->param_groups()[0].options->get_lr(); }

 private:
  Reducer reducer_;
  std::unique_ptr<Optimizer> opt_;
  int rank_, world_size_;
};

/// post-local-sgd: the reducer's post_localSGD_hook averages gradients
/// globally during warm-up, then (local group 1) not at all or within blocks
/// of ranks; PostLocalSGDOptimizer's averager averages the parameters every
/// period steps after warm-up.
class PostLocalSgdStrategy : public Strategy {
 public:
  PostLocalSgdStrategy(const StrategyConfig& cfg, const std::vector<Tensor>& params, dopt::ProcessGroup world)
      : reducer_(params, world), rank_(world.rank()), world_size_(world.size()) {
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
  }
  std::string describe() const override {
    return "PostLocalSGD(" + opt_->optim().name() + ", warm-up " + std::to_string(warmup_) + ", period " +
           std::to_string(period_) + ")";
  }
  void grad_ready(const Tensor& p) override { reducer_.mark_ready(p); }
  void finish_step() override {
    reducer_.finalize();
    opt_->step();
  }
  std::int64_t state_bytes() const override { return optimizer_state_bytes(opt_->optim()); }
  std::int64_t owned_numel() const override { return numel_of(opt_->optim().all_params()); }
  void save(const std::string& dir) override {
    dopt::save_state_dict(opt_->state_dict(), (fs::path(dir) / optim_file_name(rank_, world_size_)).string());
  }
  void load(const std::string& dir, std::int64_t step) override {
    opt_->load_state_dict(dopt::load_state_dict((fs::path(dir) / optim_file_name(rank_, world_size_)).string()));
    // The hook counts warm-up iterations itself (it stops at start_localSGD_iter).
    hook_state_->iter = std::min(step, hook_state_->start_localSGD_iter);
  }
  double lr() const override { return opt_->param_groups()[0].options->get_lr(); }

 private:
  Reducer reducer_;
  std::shared_ptr<PostLocalSGDState> hook_state_;
  std::unique_ptr<PostLocalSGDOptimizer> opt_;
  int rank_, world_size_;
  std::int64_t warmup_ = 0, period_ = 1;
};

}  // namespace

std::vector<std::string> available_modes() { return {"zero", "post-local-sgd", "ddp", "remote"}; }

bool mode_available(const std::string& mode, std::string* why) {
  if (mode == "remote") {
#ifdef DOPT_TRAIN_HAVE_REMOTE
    return true;  // remote.cpp: not a Strategy (it runs over dopt::rpc, without a process group)
#endif
    if (why)
      *why = "--optim remote (DistributedOptimizer with parameter owners) is not available in this build: "
             "dopt's RPC layer (dopt/actors/rpc.hpp, dopt/optim/distributed_optimizer.hpp) is not built in yet; "
             "use --optim zero, ddp or post-local-sgd";
    return false;
  }
  return mode == "zero" || mode == "ddp" || mode == "post-local-sgd";
}

std::unique_ptr<Strategy> make_strategy(const StrategyConfig& cfg, const std::vector<Tensor>& params,
                                        dopt::ProcessGroup world) {
  std::string why;
  if (!mode_available(cfg.mode, &why)) throw dopt::NotSupportedError("dopt-train", why);
  if (cfg.mode == "remote") throw dopt::NotSupportedError("dopt-train", "--optim remote runs run_remote(), not a Strategy");
  if (cfg.mode == "zero") return std::make_unique<ZeroStrategy>(cfg, params, world);
  if (cfg.mode == "ddp") return std::make_unique<DdpStrategy>(cfg, params, world);
  return std::make_unique<PostLocalSgdStrategy>(cfg, params, world);
}

std::string optim_file_name(int rank, int world_size) {
  return ZeroRedundancyOptimizer::shard_file_name(rank, world_size);
}

}  // namespace dopt_train
