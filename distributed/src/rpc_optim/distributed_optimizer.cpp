// DistributedOptimizer over dopt::rpc (distributed_optimizer.hpp).
#include "dopt/distributed/distributed_optimizer.hpp"

#include <atomic>
#include <map>
#include <mutex>
#include <tuple>

#include "distributed_optimizer_detail.hpp"
#include "dopt/actors/internal/call_label.hpp"
#include "dopt/actors/internal/served_mutex.hpp"
#include "distributed_optimizer_testing.hpp"
#include "dopt/actors/rpc_membership.hpp"

namespace dopt::optim {

namespace {

std::mutex g_hook_mutex;
std::function<void(rpc::Agent&, long)> g_hook;
std::function<bool(rpc::Agent&, const char*, long)> g_probe;

bool probe(rpc::Agent& a, const char* point, long step) {
  std::function<bool(rpc::Agent&, const char*, long)> p;
  {
    std::lock_guard<std::mutex> h(g_hook_mutex);
    p = g_probe;
  }
  return p && p(a, point, step);
}

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

using detail::check_epoch;
using detail::owner_name;

/// Completes when all fs did; on failures, one error naming every failed owner.
Future<void> join_owners(std::vector<Future<void>> fs, std::vector<rpc::WorkerInfo> who, std::string op, int rank,
                         bool redundant) {
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
    (void)fs[i].then([j, i, who, op, rank, redundant](const Future<void>& f) {
      bool last;
      {
        std::lock_guard<std::mutex> lock(j->m);
        j->errors[i] = f.exception();
        last = --j->left == 0;
      }
      if (!last) return;
      if (auto e = detail::joined_error(j->errors, who, op, rank, redundant))
        j->p.set_exception(e);
      else
        j->p.set_value();
    });
  }
  return out;
}

bool is_lost(const rpc::Agent& a, int rank) { return a.wait_until_lost(rank, std::chrono::milliseconds(0)); }

/// Waits for the buddies' replies; a lost buddy is the trainer's to recover.
void join_mirrors(std::vector<Future<void>>& fs) {
  for (auto& f : fs) {
    try {
      f.get();
    } catch (const PeerLostError&) {
    }
  }
}

OwnerOptimizer make_owner(rpc::Agent& a, const std::string& spec_json, std::vector<rpc::RRef<Tensor>> params) {
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
}

}  // namespace

namespace detail {
void set_owner_step_hook(std::function<void(rpc::Agent&, long)> hook) {
  std::lock_guard<std::mutex> lock(g_hook_mutex);
  g_hook = std::move(hook);
}
void set_owner_probe(std::function<bool(rpc::Agent&, const char*, long)> p) {
  std::lock_guard<std::mutex> lock(g_hook_mutex);
  g_probe = std::move(p);
}

bool owner_probe(rpc::Agent& a, const char* point, long step) { return probe(a, point, step); }

/// The epoch of a message against this worker's record of the line.
void check_epoch(rpc::Agent& a, std::uint64_t line, std::uint64_t epoch, const char* op) {
  const std::uint64_t here = rpc::membership_epoch(a, line);
  if (epoch != here)
    throw StateError(op, "a message of membership epoch " + std::to_string(epoch) + " reached " +
                             owner_name(a.worker_info()) + ", which is at epoch " + std::to_string(here) +
                             " (a message of another membership is refused)", a.rank());
}

std::string owner_name(const rpc::WorkerInfo& w) {
  return "worker '" + w.name + "' (rank " + std::to_string(w.rank) + ")";
}

std::exception_ptr joined_error(const std::vector<std::exception_ptr>& errors, const std::vector<rpc::WorkerInfo>& who,
                                const std::string& op, int rank, bool redundant) {
  std::string msg, kind, lost;
  std::size_t failed = 0;
  for (std::size_t k = 0; k < errors.size(); ++k) {
    if (!errors[k]) continue;
    ++failed;
    std::string what;
    try {
      std::rethrow_exception(errors[k]);
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
  if (!failed) return nullptr;
  // A lost owner took its parameters and their optimizer state with it:
  // without redundancy no other owner keeps a copy (docs/fault-tolerance-optimizers.md).
  if (!lost.empty() && !redundant)
    msg += ". The parameters and optimizer state held by " + lost +
           " are gone: DistributedOptimizer keeps no copy of an owner's state on another owner (see "
           "DistributedOptimizerOptions::redundancy). Fall back to the last checkpoint: restart the owners from the "
           "model's checkpoint and build a new DistributedOptimizer over them (its optimizer state starts again)";
  return rpc::make_error(kind, op,
                         std::to_string(failed) + " of " + std::to_string(errors.size()) + " owners failed: " + msg,
                         rank);
}
}  // namespace detail

void DistributedOptimizer::register_functions() {
  static std::once_flag once;
  std::call_once(once, [] {
    (void)g_registered;
    rpc::register_membership_functions();
    // Errors of these calls name the public call first (call_label.hpp).
    for (const auto& [fn, call] : std::initializer_list<std::pair<const char*, const char*>>{
             {"dopt.optim.create", "DistributedOptimizer::DistributedOptimizer()"},
             {"dopt.optim.create_r", "DistributedOptimizer::DistributedOptimizer()"},
             {"dopt.optim.create_mirror", "DistributedOptimizer::DistributedOptimizer()"},
             {"dopt.optim.mirror_steps", "DistributedOptimizer::DistributedOptimizer()"},
             {"dopt.optim.step", "DistributedOptimizer::step()"},
             {"dopt.optim.step_r", "DistributedOptimizer::step()"},
             {"dopt.optim.mirror_step", "DistributedOptimizer::step()"},
             {"dopt.optim.zero_grad", "DistributedOptimizer::zero_grad()"},
             {"dopt.optim.set_lr", "DistributedOptimizer::set_lr()"},
             {"dopt.optim.mirror_set_lr", "DistributedOptimizer::set_lr()"},
             {"dopt.optim.set_hyperparameters", "DistributedOptimizer::set_hyperparameters()"},
             {"dopt.optim.mirror_set_hyperparameters", "DistributedOptimizer::set_hyperparameters()"},
             {"dopt.optim.lr", "DistributedOptimizer::lrs()"},
             {"dopt.optim.mirror_promote", "DistributedOptimizer::step() (taking over a lost owner)"}})
      dopt::detail::name_rpc_function(fn, call);
    detail::register_grow_functions();
    rpc::register_function("dopt.optim.create", [](rpc::Agent& a, const std::string& spec_json,
                                                   std::vector<rpc::RRef<Tensor>> params) {
      return make_owner(a, spec_json, std::move(params));
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
      std::vector<Future<void>> fwd;
      {
        std::lock_guard<StepMutex> lock(owner_step_mutex(a));
        o.optimizer->set_lr(lr);
        for (auto& m : o.mirrors)
          if (!is_lost(a, m.owner_rank())) fwd.push_back(m.rpc_async<void>("dopt.optim.mirror_set_lr", lr));
      }
      join_mirrors(fwd);
    });
    rpc::register_method<OwnerOptimizer>(
        "dopt.optim.set_hyperparameters", [](rpc::Agent& a, OwnerOptimizer& o, const std::string& json) {
          std::vector<Future<void>> fwd;
          {
            std::lock_guard<StepMutex> lock(owner_step_mutex(a));
            o.optimizer->set_defaults(hyper_from_json(json, "DistributedOptimizer.set_hyperparameters"));
            for (auto& m : o.mirrors)
              if (!is_lost(a, m.owner_rank()))
                fwd.push_back(m.rpc_async<void>("dopt.optim.mirror_set_hyperparameters", json));
          }
          join_mirrors(fwd);
        });
    rpc::register_method<OwnerOptimizer>("dopt.optim.lr", [](OwnerOptimizer& o) { return o.optimizer->lr(); });

    // --- redundancy (distributed_optimizer.hpp, "Redundancy") ---
    rpc::register_function("dopt.optim.create_r",
                           [](rpc::Agent& a, const std::string& spec_json, std::vector<rpc::RRef<Tensor>> params,
                              std::uint64_t line, std::vector<rpc::RRef<OwnerMirror>> mirrors) {
                             OwnerOptimizer o = make_owner(a, spec_json, std::move(params));
                             o.line = line;
                             o.mirrors = std::move(mirrors);
                             return o;
                           });
    // A numbered step: applied once; the gradients go to the buddies too.
    rpc::register_method<OwnerOptimizer>(
        "dopt.optim.step_r",
        [](rpc::Agent& a, OwnerOptimizer& o, std::uint64_t ctx, std::uint64_t epoch, std::int64_t s) {
          const char* op = "DistributedOptimizer.step";
          check_epoch(a, o.line, epoch, op);
          if (o.steps == s + 1) return;  // applied already: a step redone after a recovery
          if (o.steps != s)
            throw StateError(op, owner_name(a.worker_info()) + " has applied " + std::to_string(o.steps) +
                                     " steps; the trainer sent step " + std::to_string(s), a.rank());
          if (probe(a, "begin", s)) return;
          std::vector<Future<void>> fwd;
          {
            std::lock_guard<StepMutex> lock(owner_step_mutex(a));
            std::vector<Tensor> grads;
            grads.reserve(o.ids.size());
            for (auto id : o.ids) grads.push_back(a.context_grad(ctx, id));  // undefined: skipped
            for (auto& m : o.mirrors)
              if (!is_lost(a, m.owner_rank()))
                fwd.push_back(m.rpc_async<void>("dopt.optim.mirror_step", epoch, s, grads));
            o.optimizer->step(grads);
            ++o.steps;
          }
          join_mirrors(fwd);
          (void)probe(a, "mirrored", s);
        });
    rpc::register_function("dopt.optim.create_mirror", [](rpc::Agent& a, const std::string& spec_json,
                                                          std::uint64_t line, int primary, std::vector<Tensor> values) {
      OwnerMirror m;
      for (const auto& v : values) m.params.push_back(a.make_rref(v));  // this worker's own copies
      m.optimizer = make_functional(OptimizerSpec::from_json(spec_json), std::move(values));
      m.line = line;
      m.primary = primary;
      return m;
    });
    rpc::register_method<OwnerMirror>(
        "dopt.optim.mirror_step",
        [](rpc::Agent& a, OwnerMirror& m, std::uint64_t epoch, std::int64_t s, std::vector<Tensor> grads) {
          const char* op = "DistributedOptimizer.step (buddy)";
          check_epoch(a, m.line, epoch, op);
          if (m.promoted) throw StateError(op, "this copy was taken over already", a.rank());
          if (m.steps == s + 1) return;
          if (m.steps != s)
            throw StateError(op, "the copy on " + owner_name(a.worker_info()) + " of rank " +
                                     std::to_string(m.primary) + "'s parameters has applied " +
                                     std::to_string(m.steps) + " steps; its owner sent step " + std::to_string(s),
                             a.rank());
          m.optimizer->step(grads);
          ++m.steps;
        });
    rpc::register_method<OwnerMirror>("dopt.optim.mirror_set_lr",
                                      [](OwnerMirror& m, double lr) { m.optimizer->set_lr(lr); });
    rpc::register_method<OwnerMirror>("dopt.optim.mirror_set_hyperparameters", [](OwnerMirror& m, const std::string& json) {
      m.optimizer->set_defaults(hyper_from_json(json, "DistributedOptimizer.set_hyperparameters"));
    });
    rpc::register_method<OwnerMirror>("dopt.optim.mirror_steps", [](OwnerMirror& m) {
      return static_cast<std::int64_t>(m.promoted ? -1 : m.steps);
    });
    // The takeover: the copy becomes an owner's optimizer (in the copy's
    // strand, so after every step its lost owner had forwarded).
    rpc::register_method<OwnerMirror>(
        "dopt.optim.mirror_promote",
        [](rpc::Agent& a, OwnerMirror& m, std::uint64_t epoch, std::vector<rpc::RRef<OwnerMirror>> others) {
          const char* op = "DistributedOptimizer.recover";
          check_epoch(a, m.line, epoch, op);
          if (m.promoted) throw StateError(op, "this copy was taken over already", a.rank());
          if (probe(a, "promote", m.steps)) throw StateError(op, "lost by the test", a.rank());
          OwnerOptimizer o;
          o.optimizer = std::move(m.optimizer);
          o.params = m.params;
          for (auto& p : o.params) o.ids.push_back(p.id());
          o.steps = m.steps;
          o.line = m.line;
          o.mirrors = std::move(others);
          m.promoted = true;
          const auto steps = static_cast<std::int64_t>(o.steps);
          auto params = o.params;
          return std::make_tuple(a.make_rref(std::move(o)), std::move(params), steps);
        });
  });
}

DistributedOptimizer::DistributedOptimizer(rpc::Agent agent, OptimizerSpec spec,
                                           const std::vector<rpc::RRef<Tensor>>& params,
                                           DistributedOptimizerOptions options)
    : agent_(std::move(agent)), spec_(std::move(spec)), options_(std::move(options)) {
  register_functions();
  const char* op = "DistributedOptimizer";
  if (params.empty()) throw ValueError(op, "got an empty parameter list", agent_.rank());
  std::map<int, std::vector<std::size_t>> by_owner;
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (!params[i].valid()) throw ValueError(op, "an empty RRef in the parameter list", agent_.rank());
    by_owner[params[i].owner_rank()].push_back(i);
  }
  const int k = options_.redundancy;
  const int n = static_cast<int>(by_owner.size());
  if (k < 0) throw ValueError(op, "redundancy must be >= 0, got " + std::to_string(k), agent_.rank());
  if (k > 0 && n < k + 1)
    throw ValueError(op, "redundancy " + std::to_string(k) + " needs at least " + std::to_string(k + 1) +
                             " owners (each owner's buddies are other owners), the parameters have " +
                             std::to_string(n), agent_.rank());
  params_ = params;
  const std::string json = spec_.to_json();
  rpc::Fn create(k > 0 ? "dopt.optim.create_r" : "dopt.optim.create");
  create.timeout = options_.timeout;
  create.retries = options_.retries;
  if (k > 0) {
    static std::atomic<std::uint64_t> next_line{1};
    line_ = (static_cast<std::uint64_t>(agent_.rank()) << 48) | (std::uint64_t(1) << 47) | next_line.fetch_add(1);
    std::vector<int> ranks;
    std::vector<std::vector<Future<Tensor>>> values;
    for (auto& [rank, idx] : by_owner) {
      ranks.push_back(rank);
      values.emplace_back();
      for (auto i : idx) values.back().push_back(params[i].to_here_async(options_.timeout));
    }
    std::vector<std::vector<Tensor>> got(values.size());
    for (std::size_t o = 0; o < values.size(); ++o)
      for (auto& f : values[o]) got[o].push_back(f.get());
    rpc::Fn mk("dopt.optim.create_mirror");
    mk.timeout = options_.timeout;
    std::size_t o = 0;
    for (auto& [rank, idx] : by_owner) {
      Owner w;
      w.rank = rank;
      w.home = rank;
      w.params = idx;
      std::vector<rpc::RRef<OwnerMirror>> refs;
      for (int j = 1; j <= k; ++j) {
        const int b = ranks[(o + static_cast<std::size_t>(j)) % ranks.size()];
        w.mirrors.push_back(Mirror{b, agent_.remote<OwnerMirror>(b, mk, json, line_, rank, got[o])});
        refs.push_back(w.mirrors.back().ref);
      }
      std::vector<rpc::RRef<Tensor>> ps;
      for (auto i : idx) ps.push_back(params[i]);
      w.local = agent_.remote<OwnerOptimizer>(rank, create, json, ps, line_, refs);
      owners_.push_back(std::move(w));
      ++o;
    }
    // Every buddy has built its copy.
    for (auto& w : owners_)
      for (auto& m : w.mirrors) (void)m.ref.rpc_sync<std::int64_t>(rpc::Fn("dopt.optim.mirror_steps", {options_.timeout}));
  } else {
    for (auto& [rank, idx] : by_owner) {
      std::vector<rpc::RRef<Tensor>> ps;
      for (auto i : idx) ps.push_back(params[i]);
      owners_.push_back(Owner{rank, rank, agent_.remote<OwnerOptimizer>(rank, create, json, ps), idx, {}});
    }
  }
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
  return join_owners(std::move(fs), std::move(who), what, agent_.rank(), options_.redundancy > 0);
}

Future<void> DistributedOptimizer::step_async(std::uint64_t context_id) {
  if (options_.redundancy > 0) {
    try {
      step_redundant(agent_.attach_context(context_id));
      return make_ready_future();
    } catch (...) {
      return make_failed_future<void>(std::current_exception());
    }
  }
  return fan_out("DistributedOptimizer.step", "dopt.optim.step", context_id);
}

Future<void> DistributedOptimizer::step_async(const rpc::GradContext& ctx) {
  if (options_.redundancy > 0) {
    try {
      step_redundant(ctx);
      return make_ready_future();
    } catch (...) {
      return make_failed_future<void>(std::current_exception());
    }
  }
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

void DistributedOptimizer::step(const rpc::GradContext& ctx) {
  if (options_.redundancy > 0)
    step_redundant(ctx);
  else
    step_async(ctx).get();
}

void DistributedOptimizer::zero_grad(const rpc::GradContext& ctx) {
  with_recovery("DistributedOptimizer.zero_grad", [&] {
    fan_out("DistributedOptimizer.zero_grad", "dopt.optim.zero_grad", ctx.id()).get();
  });
}

void DistributedOptimizer::set_lr(double lr) {
  with_recovery(
      "DistributedOptimizer.set_lr", [&] { fan_out("DistributedOptimizer.set_lr", "dopt.optim.set_lr", lr).get(); },
      [&] {
        hyper_["lr"] = lr;
        staged_.erase("lr");
      });
}

void DistributedOptimizer::set_hyperparameters(const Hyperparams& h) {
  Hyperparams all = staged_;
  for (const auto& [k, v] : h) all[k] = v;
  with_recovery(
      "DistributedOptimizer.set_hyperparameters",
      [&] {
        fan_out("DistributedOptimizer.set_hyperparameters", "dopt.optim.set_hyperparameters", hyper_to_json(all)).get();
      },
      [&] {
        for (const auto& [k, v] : h) hyper_[k] = v;
        staged_.clear();
      });
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
  with_recovery(
      "DistributedOptimizer.commit_hyperparameters",
      [&] {
        fan_out("DistributedOptimizer.commit_hyperparameters", "dopt.optim.set_hyperparameters",
                hyper_to_json(staged_))
            .get();
      },
      [&] { staged_.clear(); });
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
