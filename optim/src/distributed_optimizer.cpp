// DistributedOptimizer over dopt::rpc (distributed_optimizer.hpp).
#include "dopt/optim/distributed_optimizer.hpp"

#include <map>
#include <mutex>

namespace dopt::optim {

namespace {

std::mutex g_hook_mutex;
std::function<void(rpc::Agent&, long)> g_hook;

/// One local-optimizer step at a time per worker (any optimizer, any trainer).
/// A step may wait while it holds it (the test hook): under the deterministic
/// scheduler a waiter gives the baton up.
using StepMutex = rpc::detail::ServedMutex;
StepMutex& owner_step_mutex(const rpc::Agent& a) {
  static std::mutex m;
  static std::map<const void*, std::unique_ptr<StepMutex>> per_worker;
  std::lock_guard<std::mutex> lock(m);
  auto& p = per_worker[a.core().get()];
  if (!p) p = std::make_unique<StepMutex>();
  return *p;
}

const bool g_registered = (DistributedOptimizer::register_functions(), true);

std::string owner_name(const rpc::WorkerInfo& w) {
  return "worker '" + w.name + "' (rank " + std::to_string(w.rank) + ")";
}

/// Completes when all fs did; on failures, one error naming every failed owner.
Future<void> join_owners(std::vector<Future<void>> fs, std::vector<rpc::WorkerInfo> who, std::string op, int rank) {
  struct Join {
    std::mutex m;
    std::size_t left = 0;
    std::vector<std::exception_ptr> errors;
    Promise<void> p;
  };
  auto j = std::make_shared<Join>();
  j->left = fs.size();
  j->errors.resize(fs.size());
  auto out = j->p.get_future();
  if (fs.empty()) {
    j->p.set_value();
    return out;
  }
  for (std::size_t i = 0; i < fs.size(); ++i) {
    (void)fs[i].then([j, i, who, op, rank](const Future<void>& f) {
      bool last;
      {
        std::lock_guard<std::mutex> lock(j->m);
        j->errors[i] = f.exception();
        last = --j->left == 0;
      }
      if (!last) return;
      std::string msg, kind, lost;
      std::size_t failed = 0;
      for (std::size_t k = 0; k < j->errors.size(); ++k) {
        if (!j->errors[k]) continue;
        ++failed;
        std::string what;
        try {
          std::rethrow_exception(j->errors[k]);
        } catch (const Error& e) {
          if (kind.empty()) kind = rpc::error_kind(e);
          if (rpc::error_kind(e) == "PeerLostError") lost += (lost.empty() ? "" : ", ") + owner_name(who[k]);
          what = e.what();
        } catch (const std::exception& e) {
          if (kind.empty()) kind = "Error";
          what = e.what();
        }
        msg += (msg.empty() ? "" : "; ") + owner_name(who[k]) + ": " + what;
      }
      if (!failed) {
        j->p.set_value();
        return;
      }
      // A lost owner took its parameters and their optimizer state with it:
      // no other owner keeps a copy (docs/fault-tolerance.md).
      if (!lost.empty())
        msg += ". The parameters and optimizer state held by " + lost +
               " are gone: DistributedOptimizer keeps no copy of an owner's state on another owner. Fall back to "
               "the last checkpoint: restart the owners from the model's checkpoint and build a new "
               "DistributedOptimizer over them (its optimizer state starts again)";
      j->p.set_exception(rpc::make_error(kind, op,
                                         std::to_string(failed) + " of " + std::to_string(j->errors.size()) +
                                             " owners failed: " + msg,
                                         rank));
    });
  }
  return out;
}

}  // namespace

namespace detail {
void set_owner_step_hook(std::function<void(rpc::Agent&, long)> hook) {
  std::lock_guard<std::mutex> lock(g_hook_mutex);
  g_hook = std::move(hook);
}
}  // namespace detail

void DistributedOptimizer::register_functions() {
  static std::once_flag once;
  std::call_once(once, [] {
    (void)g_registered;
    rpc::register_function("dopt.optim.create", [](rpc::Agent& a, const std::string& spec_json,
                                                   std::vector<rpc::RRef<Tensor>> params) {
      OwnerOptimizer o;
      std::vector<Tensor> tensors;
      for (auto& p : params) {
        if (!p.is_owner())
          throw ValueError("DistributedOptimizer", "parameter " + std::to_string(p.id()) + " is owned by " +
                                                       owner_name(p.owner()) + ", not by this worker", a.rank());
        tensors.push_back(p.local_value());
        o.ids.push_back(p.id());
      }
      o.optimizer = make_functional(OptimizerSpec::from_json(spec_json), std::move(tensors));
      o.params = std::move(params);
      return o;
    });
    rpc::register_method<OwnerOptimizer>("dopt.optim.step", [](rpc::Agent& a, OwnerOptimizer& o, std::uint64_t ctx) {
      std::lock_guard<StepMutex> lock(owner_step_mutex(a));
      std::function<void(rpc::Agent&, long)> hook;
      {
        std::lock_guard<std::mutex> h(g_hook_mutex);
        hook = g_hook;
      }
      if (hook) hook(a, o.steps);
      std::vector<Tensor> grads;
      grads.reserve(o.ids.size());
      for (auto id : o.ids) grads.push_back(a.context_grad(ctx, id));  // undefined: skipped
      o.optimizer->step(grads);
      ++o.steps;
    });
    rpc::register_method<OwnerOptimizer>("dopt.optim.zero_grad",
                                         [](rpc::Agent& a, OwnerOptimizer& o, std::uint64_t ctx) {
                                           a.drop_context_grads(ctx, o.ids);
                                         });
    rpc::register_method<OwnerOptimizer>("dopt.optim.set_lr", [](rpc::Agent& a, OwnerOptimizer& o, double lr) {
      std::lock_guard<StepMutex> lock(owner_step_mutex(a));
      o.optimizer->set_lr(lr);
    });
    rpc::register_method<OwnerOptimizer>(
        "dopt.optim.set_hyperparameters", [](rpc::Agent& a, OwnerOptimizer& o, const std::string& json) {
          std::lock_guard<StepMutex> lock(owner_step_mutex(a));
          o.optimizer->set_defaults(hyper_from_json(json, "DistributedOptimizer.set_hyperparameters"));
        });
    rpc::register_method<OwnerOptimizer>("dopt.optim.lr", [](OwnerOptimizer& o) { return o.optimizer->lr(); });
  });
}

DistributedOptimizer::DistributedOptimizer(rpc::Agent agent, OptimizerSpec spec,
                                           const std::vector<rpc::RRef<Tensor>>& params,
                                           DistributedOptimizerOptions options)
    : agent_(std::move(agent)), spec_(std::move(spec)), options_(options) {
  register_functions();
  if (params.empty()) throw ValueError("DistributedOptimizer", "got an empty parameter list", agent_.rank());
  std::map<int, std::vector<rpc::RRef<Tensor>>> by_owner;
  for (const auto& p : params) {
    if (!p.valid()) throw ValueError("DistributedOptimizer", "an empty RRef in the parameter list", agent_.rank());
    by_owner[p.owner_rank()].push_back(p);
  }
  const std::string json = spec_.to_json();
  rpc::Fn create("dopt.optim.create");
  create.timeout = options_.timeout;
  create.retries = options_.retries;
  for (auto& [rank, ps] : by_owner)
    owners_.push_back(Owner{rank, agent_.remote<OwnerOptimizer>(rank, create, json, ps)});
  num_params_ = params.size();
  // Every owner has built its optimizer (or its error comes out here).
  fan_out("DistributedOptimizer", "dopt.optim.lr").get();
  hyper_ = make_options(spec_)->to_hyperparams();
}

DistributedOptimizer::DistributedOptimizer(rpc::Agent agent, const OptimizerOptions& optimizer,
                                           const std::vector<rpc::RRef<Tensor>>& params,
                                           DistributedOptimizerOptions options)
    : DistributedOptimizer(agent, spec_of(optimizer, "DistributedOptimizer"), params, options) {}

template <class... A>
Future<void> DistributedOptimizer::fan_out(const std::string& what, const std::string& method,
                                           const A&... args) const {
  rpc::Fn fn(method);
  fn.timeout = options_.timeout;
  fn.retries = options_.retries;
  std::vector<Future<void>> fs;
  std::vector<rpc::WorkerInfo> who;
  for (const auto& o : owners_) {
    fs.push_back(o.local.rpc_async<void>(fn, args...));
    who.push_back(agent_.worker_info(o.rank));
  }
  return join_owners(std::move(fs), std::move(who), what, agent_.rank());
}

Future<void> DistributedOptimizer::step_async(std::uint64_t context_id) {
  return fan_out("DistributedOptimizer.step", "dopt.optim.step", context_id);
}

Future<void> DistributedOptimizer::step_async(const rpc::GradContext& ctx) {
  const std::uint64_t id = ctx.id();
  Promise<void> p;
  auto out = p.get_future();
  // The deposits first (their failures are the step's), then one message per owner.
  (void)ctx.deposits_done().then([this, p, id](const Future<void>& d) {
    if (auto e = d.exception()) {
      p.set_exception(e);
      return;
    }
    (void)step_async(id).then([p](const Future<void>& f) {
      if (auto e = f.exception())
        p.set_exception(e);
      else
        p.set_value();
    });
  });
  return out;
}

void DistributedOptimizer::step(const rpc::GradContext& ctx) { step_async(ctx).get(); }

void DistributedOptimizer::zero_grad(const rpc::GradContext& ctx) {
  fan_out("DistributedOptimizer.zero_grad", "dopt.optim.zero_grad", ctx.id()).get();
}

void DistributedOptimizer::set_lr(double lr) {
  fan_out("DistributedOptimizer.set_lr", "dopt.optim.set_lr", lr).get();
  hyper_["lr"] = lr;
  staged_.erase("lr");
}

void DistributedOptimizer::set_hyperparameters(const Hyperparams& h) {
  Hyperparams all = staged_;
  for (const auto& [k, v] : h) all[k] = v;
  fan_out("DistributedOptimizer.set_hyperparameters", "dopt.optim.set_hyperparameters", hyper_to_json(all)).get();
  for (const auto& [k, v] : h) hyper_[k] = v;
  staged_.clear();
}

void DistributedOptimizer::stage_hyperparameters(const Hyperparams& h) {
  // Validated here, so that a bad value fails on this worker, not on the owners.
  auto o = make_options(OptimizerSpec{spec_.name, hyper_});
  o->set_hyperparams(h);
  o->validate("DistributedOptimizer.stage_hyperparameters");
  for (const auto& [k, v] : h) {
    hyper_[k] = v;
    staged_[k] = v;
  }
}

void DistributedOptimizer::commit_hyperparameters() {
  if (staged_.empty()) return;
  fan_out("DistributedOptimizer.commit_hyperparameters", "dopt.optim.set_hyperparameters", hyper_to_json(staged_))
      .get();
  staged_.clear();
}

std::vector<double> DistributedOptimizer::lrs() const {
  rpc::Fn fn("dopt.optim.lr");
  fn.timeout = options_.timeout;
  std::vector<Future<double>> fs;
  for (const auto& o : owners_) fs.push_back(o.local.rpc_async<double>(fn));
  std::vector<double> out;
  for (auto& f : fs) out.push_back(f.get());
  return out;
}

std::vector<rpc::WorkerInfo> DistributedOptimizer::owners() const {
  std::vector<rpc::WorkerInfo> out;
  for (const auto& o : owners_) out.push_back(agent_.worker_info(o.rank));
  return out;
}

DistributedLambdaLR::DistributedLambdaLR(DistributedOptimizer& opt, std::function<double(int)> lambda)
    : opt_(opt), lambda_(std::move(lambda)) {
  if (!lambda_) throw ValueError("DistributedLambdaLR", "the lambda is empty");
  base_lr_ = opt_.lrs().front();
  last_lr_ = base_lr_ * lambda_(0);
  opt_.set_lr(last_lr_);
}

void DistributedLambdaLR::step() {
  ++epoch_;
  last_lr_ = base_lr_ * lambda_(epoch_);
  opt_.set_lr(last_lr_);
}

}  // namespace dopt::optim
