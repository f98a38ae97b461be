// DistributedOptimizer between simulated workers: bitwise parity with the
// local optimizer class for every registered class, concurrent trainers on
// shared owners, missing gradients, zero_grad / lr schedules on every owner,
// remote modules, an owner killed mid-step, deadlines.
#include <catch2/catch.hpp>

#include <atomic>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <future>
#include <mutex>
#include <optional>

#include "dopt/actors/internal/served_mutex.hpp"
#include "dopt/actors/rpc.hpp"
#include "dopt/actors/simulate.hpp"
#include "rpc/testing.hpp"
#include "dopt/distributed/distributed_optimizer.hpp"
#include "distributed_optimizer_testing.hpp"
#include "dopt/optim/lr_scheduler.hpp"
#include "reference_data.hpp"
#include "rpc_errors.hpp"

using namespace dopt;
using namespace dopt::optim;
using dopt::rpc::Agent;
using dopt::rpc::GradContext;
using dopt::rpc::RRef;
using dopt::testing::values;
using Catch::Matchers::Contains;

namespace {

using dopt::testing::error_of;

// Served: the checked expression may make RPC calls (a scheduling point of
// the deterministic scheduler) while the lock is held.
dopt::rpc::detail::ServedMutex g_catch_mutex;
using CatchLock = std::lock_guard<dopt::rpc::detail::ServedMutex>;
#define SCHECK(...) do { CatchLock l_(g_catch_mutex); CHECK(__VA_ARGS__); } while (0)
#define SCHECK_THAT(a, m) do { CatchLock l_(g_catch_mutex); CHECK_THAT(a, m); } while (0)

std::string bits_mismatch(const Tensor& got, const Tensor& want) {
  if (!got.defined() || got.dtype() != want.dtype() || got.shape() != want.shape()) return "shape/dtype differ";
  if (std::memcmp(got.data_ptr(), want.data_ptr(), got.nbytes()) != 0) return "bits differ";
  return "";
}

/// One step, in a fresh context, of `dist` and of local_opt, the local
/// optimizer of the same parameters: grad_of(k), parameter k's gradient
/// (undefined: none this step), is deposited for remote[k] and set on
/// local[k]. Called on the trainer's thread; waits for dist's step.
void step_both(Agent& a, DistributedOptimizer& dist, Optimizer& local_opt, const std::vector<RRef<Tensor>>& remote,
               std::vector<Tensor>& local, const std::function<Tensor(std::size_t)>& grad_of) {
  GradContext ctx = a.new_context();
  std::vector<std::pair<RRef<Tensor>, Tensor>> deps;
  for (std::size_t k = 0; k < remote.size(); ++k) {
    Tensor g = grad_of(k);
    if (!g.defined()) {
      local[k].set_grad(Tensor());
      continue;
    }
    local[k].set_grad(g.clone());
    deps.emplace_back(remote[k], g);
  }
  (void)ctx.deposit_all(deps);
  dist.step(ctx);
  local_opt.step();
}

struct TinyModule {
  Tensor w = Tensor::full({3}, 1.0);
  Tensor b = Tensor::full({1}, -1.0);
  std::vector<Tensor> parameters() { return {w, b}; }
};

std::mutex g_params_mutex;
// dopt's promises, not std::promise: the deterministic scheduler sees their waits.
std::map<int, Promise<std::vector<RRef<Tensor>>>> g_params;

std::mutex g_gate_mutex;
std::optional<Promise<void>> g_gate;
Future<void> g_gate_future;

void register_test_functions() {
  static std::once_flag once;
  std::call_once(once, [] {
    rpc::register_function("dt.make_param", [](std::vector<float> v, std::vector<std::int64_t> shape) {
      return Tensor::from_vector(v, shape);
    });
    rpc::register_function("dt.take_params", [](Agent& a, std::vector<RRef<Tensor>> ps) {
      std::lock_guard<std::mutex> lock(g_params_mutex);
      g_params[a.rank()].set_value(std::move(ps));
    });
    rpc::register_function("dt.make_module", [] { return TinyModule{}; });
    rpc::register_method<TinyModule>("dt.module_w", [](TinyModule& m) { return m.w.clone(); });
    rpc::register_module<TinyModule>();
  });
}

/// Runs body on the trainer (rank 0) of 3 simulated workers with p0 = [1, 2, 3]
/// on worker 1 and p1 = [4, 5] on worker 2; returns once every worker is done.
void with_two_params(const std::function<void(Agent&, RRef<Tensor>, RRef<Tensor>)>& body) {
  register_test_functions();
  rpc::simulate(3, [&](Agent& a) {
    if (a.rank() != 0) return;
    const auto p0 = a.remote<Tensor>(1, "dt.make_param", std::vector<float>{1, 2, 3}, std::vector<std::int64_t>{3});
    const auto p1 = a.remote<Tensor>(2, "dt.make_param", std::vector<float>{4, 5}, std::vector<std::int64_t>{2});
    body(a, p0, p1);
  });
}

/// K parameters spread over the owners 1..n-1; T steps, each in a fresh
/// context with some gradients missing; after every step every remote
/// parameter equals the local class's bit for bit.
void check_parity(const OptimizerSpec& spec, int n) {
  register_test_functions();
  std::atomic<int> compared{0};
  rpc::simulate(n, [&](Agent& a) {
    if (a.rank() != 0) return;
    // Muon takes matrices only.
    const std::vector<Shape> shapes = spec.name == "Muon" ? std::vector<Shape>{{4, 6}, {2, 3}, {6, 4}, {3, 3}, {1, 5}}
                                                          : std::vector<Shape>{{37}, {2, 3}, {5}, {16}, {1}};
    std::vector<Tensor> local;
    std::vector<RRef<Tensor>> remote;
    for (std::size_t k = 0; k < shapes.size(); ++k) {
      const auto v = values<float>(static_cast<std::size_t>(shape_numel(shapes[k])), 10 + k);
      const int owner = 1 + static_cast<int>(k) % (n - 1);
      remote.push_back(a.remote<Tensor>(owner, "dt.make_param", v, shapes[k]));
      local.push_back(Tensor::from_vector(v, shapes[k]));
    }
    DistributedOptimizer dist(a, spec, remote);
    SCHECK(static_cast<int>(dist.owners().size()) == std::min<int>(n - 1, static_cast<int>(shapes.size())));
    auto lopt = make_optimizer(spec, {OptimizerParamGroup(local)});
    for (int t = 0; t < 5; ++t) {
      step_both(a, dist, *lopt, remote, local, [&](std::size_t k) {
        const bool none = t > 0 && (k + static_cast<std::size_t>(t)) % 3 == 0;
        if (none) return Tensor();
        return Tensor::from_vector(values<float>(static_cast<std::size_t>(shape_numel(shapes[k])), 100 * t + k, 2.0),
                                   shapes[k]);
      });
      for (std::size_t k = 0; k < shapes.size(); ++k) {
        const std::string m = bits_mismatch(remote[k].to_here(), local[k]);
        CatchLock l(g_catch_mutex);
        INFO(spec.name << " step " << t << " param " << k);
        CHECK(m == "");
        ++compared;
      }
    }
  });
  CHECK(compared == 25);
}

}  // namespace

TEST_CASE("DistributedOptimizer equals the local optimizer bit for bit, for every class (3 workers)",
          "[distributed_optimizer]") {
  const std::vector<OptimizerSpec> specs{
      {"SGD", {{"lr", 0.05}, {"momentum", 0.9}, {"weight_decay", 0.01}, {"nesterov", true}}},
      {"SGD", {{"lr", 0.1}}},
      {"Adam", {{"lr", 0.01}, {"amsgrad", true}, {"weight_decay", 0.1}}},
      {"AdamW", {{"lr", 0.01}}},
      {"Adagrad", {{"lr", 0.1}, {"lr_decay", 0.01}}},
      {"RMSprop", {{"lr", 0.01}, {"momentum", 0.5}, {"centered", true}}},
      {"Adamax", {{"lr", 0.01}}},
      {"Adadelta", {{"lr", 0.5}}},
      {"Rprop", {{"lr", 0.02}}},
      {"NAdam", {{"lr", 0.01}, {"weight_decay", 0.1}}},
      {"RAdam", {{"lr", 0.01}, {"weight_decay", 0.1}}},
      {"Muon", {{"lr", 0.02}, {"weight_decay", 0.05}, {"ns_dtype", "float32"}}},
  };
  for (const auto& spec : specs) {
    INFO(spec.to_json());
    check_parity(spec, 3);
  }
  // every registered class is covered
  std::set<std::string> names;
  for (const auto& s : specs) names.insert(s.name);
  for (const auto& r : registered_optimizers()) CHECK(names.count(r));
}

TEST_CASE("DistributedOptimizer parity with 5 workers (4 owners)", "[distributed_optimizer]") {
  check_parity({"Adam", {{"lr", 0.003}}}, 5);
  check_parity({"SGD", {{"lr", 0.02}, {"momentum", 0.5}}}, 5);
}

TEST_CASE("DistributedOptimizer: three trainers step concurrently on two shared owners without a lost update",
          "[distributed_optimizer]") {
  register_test_functions();
  {
    std::lock_guard<std::mutex> lock(g_params_mutex);
    g_params.clear();
    for (int r : {3, 4}) g_params[r];
  }
  constexpr int kSteps = 20;
  std::atomic<int> finished{0};
  std::atomic<int> checked{0};
  rpc::simulate(5, [&](Agent& a) {
    if (a.rank() < 2) return;  // owners 0 and 1 serve
    std::vector<RRef<Tensor>> ps;
    if (a.rank() == 2) {
      for (int k = 0; k < 3; ++k)
        ps.push_back(a.remote<Tensor>(k % 2, "dt.make_param", std::vector<float>(16, 100.f), std::vector<std::int64_t>{16}));
      a.rpc_sync(3, "dt.take_params", ps);
      a.rpc_sync(4, "dt.take_params", ps);
    } else {
      Future<std::vector<RRef<Tensor>>> f;
      {
        std::lock_guard<std::mutex> lock(g_params_mutex);
        f = g_params[a.rank()].get_future();
      }
      ps = f.get();
    }
    DistributedOptimizer dist(a, OptimizerSpec{"SGD", {{"lr", 1.0}}}, ps);
    for (int t = 0; t < kSteps; ++t) {
      GradContext ctx = a.new_context();
      std::vector<std::pair<RRef<Tensor>, Tensor>> deps;
      for (auto& p : ps) deps.emplace_back(p, Tensor::full({16}, 1.0));
      (void)ctx.deposit_all(deps);
      dist.step(ctx);
    }
    if (++finished == 3) {
      // every step of every trainer was applied: 100 - 3 * 20
      for (auto& p : ps) {
        SCHECK(bits_mismatch(p.to_here(), Tensor::full({16}, 100.0 - 3 * kSteps)) == "");
        ++checked;
      }
    }
  });
  CHECK(checked == 3);
}

TEST_CASE("DistributedOptimizer: a parameter without a gradient in the context is skipped, nothing stale reapplied",
          "[distributed_optimizer]") {
  with_two_params([](Agent& a, RRef<Tensor> p0, RRef<Tensor> p1) {
    DistributedOptimizer dist(a, {"SGD", {{"lr", 0.1}, {"momentum", 0.9}}}, {p0, p1});
    {
      GradContext c1 = a.new_context();
      (void)c1.deposit_all({{p0, Tensor::full({3}, 1.0)}, {p1, Tensor::full({2}, 1.0)}});
      dist.step(c1);
    }
    const Tensor p1_after = p1.to_here();
    const Tensor p0_after = p0.to_here();
    GradContext c2 = a.new_context();
    (void)c2.deposit(p0, Tensor::full({3}, 1.0));
    dist.step(c2);
    SCHECK(bits_mismatch(p1.to_here(), p1_after) == "");  // no gradient: untouched (no momentum step either)
    SCHECK(bits_mismatch(p0.to_here(), p0_after) != "");  // the other one moved
    // a context with nothing in it changes nothing
    const Tensor p0_now = p0.to_here();
    dist.step(a.new_context());
    SCHECK(bits_mismatch(p0.to_here(), p0_now) == "");
  });
}

TEST_CASE("DistributedOptimizer: zero_grad, set_lr, set_hyperparameters and LambdaLR act on every owner",
          "[distributed_optimizer]") {
  with_two_params([](Agent& a, RRef<Tensor> p0, RRef<Tensor> p1) {
    DistributedOptimizer dist(a, {"SGD", {{"lr", 0.1}}}, {p0, p1});
    GradContext ctx = a.new_context();
    (void)ctx.deposit_all({{p0, Tensor::full({3}, 1.0)}, {p1, Tensor::full({2}, 1.0)}});
    ctx.deposits_done().get();
    dist.zero_grad(ctx);
    dist.step(ctx);
    SCHECK(bits_mismatch(p0.to_here(), Tensor::from_vector(std::vector<float>{1, 2, 3})) == "");
    dist.set_lr(0.5);
    SCHECK(dist.lrs() == std::vector<double>{0.5, 0.5});
    DistributedLambdaLR sched(dist, [](int e) { return e == 0 ? 1.0 : 0.5; });
    SCHECK(dist.lrs() == std::vector<double>{0.5, 0.5});
    sched.step();
    SCHECK(dist.lrs() == std::vector<double>{0.25, 0.25});
    // the step uses the scheduled lr: same as a local SGD with lr 0.25
    Tensor l0 = Tensor::from_vector(std::vector<float>{1, 2, 3});
    auto lopt = make_optimizer({"SGD", {{"lr", 0.25}}}, {OptimizerParamGroup({l0})});
    const Tensor g = Tensor::from_vector(std::vector<float>{0.3f, -0.7f, 1.1f});
    l0.set_grad(g.clone());
    lopt->step();
    GradContext c2 = a.new_context();
    (void)c2.deposit(p0, g);
    dist.step(c2);
    SCHECK(bits_mismatch(p0.to_here(), l0) == "");
    dist.set_hyperparameters({{"momentum", 0.9}});
    SCHECK_THAT(error_of([&] { dist.set_hyperparameters({{"lr", -1.0}}); }),
                Contains("ValueError") && Contains("2 of 2 owners failed"));
    SCHECK(dist.lrs() == std::vector<double>{0.25, 0.25});
    SCHECK_THAT(error_of([&] { DistributedOptimizer bad(a, {"Lamb", {}}, {p0}); }),
                Contains("ValueError") && Contains("Lamb"));
  });
}

TEST_CASE("DistributedOptimizer over a remote module's remote_parameters updates the module", "[distributed_optimizer]") {
  register_test_functions();
  rpc::simulate(3, [](Agent& a) {
    if (a.rank() != 0) return;
    auto m = a.remote<TinyModule>("worker2", "dt.make_module");
    std::vector<RRef<Tensor>> ps = rpc::remote_parameters(m);
    SCHECK(ps.size() == 2);
    SCHECK(ps[0].owner().name == "worker2");
    DistributedOptimizer dist(a, {"SGD", {{"lr", 0.5}}}, ps);
    GradContext ctx = a.new_context();
    (void)ctx.deposit(ps[0], Tensor::full({3}, 1.0));
    dist.step(ctx);
    SCHECK(bits_mismatch(m.rpc_sync<Tensor>("dt.module_w"), Tensor::full({3}, 0.5)) == "");
  });
}

TEST_CASE("DistributedOptimizer: an owner killed mid-step fails the step with an error naming that owner",
          "[distributed_optimizer]") {
  register_test_functions();
  const int n = GENERATE(3, 5);
  const int victim = n - 1;
  dopt::optim::detail::set_owner_step_hook([victim](Agent& a, long step) {
    if (a.rank() == victim && step == 1) rpc::testing::kill(a);
  });
  rpc::simulate(n, [n, victim](Agent& a) {
    if (a.rank() != 0) return;
    std::vector<RRef<Tensor>> ps;
    for (int r = 1; r < n; ++r)
      ps.push_back(a.remote<Tensor>(r, "dt.make_param", std::vector<float>{1, 2}, std::vector<std::int64_t>{2}));
    DistributedOptimizer dist(a, {"Adam", {{"lr", 0.1}}}, ps);
    auto step_once = [&] {
      GradContext ctx = a.new_context();
      std::vector<std::pair<RRef<Tensor>, Tensor>> deps;
      for (auto& p : ps) deps.emplace_back(p, Tensor::full({2}, 1.0));
      (void)ctx.deposit_all(deps);
      dist.step(ctx);
    };
    step_once();  // fine
    const std::string e = error_of(step_once);
    const std::string name = "'worker" + std::to_string(victim) + "' (rank " + std::to_string(victim) + ")";
    SCHECK_THAT(e, Contains("PeerLostError") && Contains("1 of " + std::to_string(n - 1) + " owners failed") &&
                       Contains(name) && Contains("dopt.optim.step"));
    SCHECK_THAT(e, Contains("optimizer state held by worker " + name + " are gone") &&
                       Contains("Fall back to the last checkpoint"));
    SCHECK_THAT(e, !Contains("'worker1' (rank 1):"));
    // later steps fail at once, naming it again
    SCHECK_THAT(error_of(step_once), Contains("PeerLostError") && Contains(name));
  });
  dopt::optim::detail::set_owner_step_hook({});
}

TEST_CASE("DistributedOptimizer: a step whose owner does not answer in time fails with TimeoutError, its retries apply once",
          "[distributed_optimizer]") {
  register_test_functions();
  {
    std::lock_guard<std::mutex> lock(g_gate_mutex);
    g_gate.emplace();
    g_gate_future = g_gate->get_future();
  }
  dopt::optim::detail::set_owner_step_hook([](Agent& a, long step) {
    if (a.rank() == 1 && step == 0) {
      Future<void> f;
      {
        std::lock_guard<std::mutex> lock(g_gate_mutex);
        f = g_gate_future;
      }
      f.wait();
    }
  });
  rpc::simulate(3, [](Agent& a) {
    if (a.rank() != 0) return;
    auto p1 = a.remote<Tensor>(1, "dt.make_param", std::vector<float>{1}, std::vector<std::int64_t>{1});
    auto p2 = a.remote<Tensor>(2, "dt.make_param", std::vector<float>{1}, std::vector<std::int64_t>{1});
    DistributedOptimizerOptions o;
    o.timeout = std::chrono::milliseconds(500);  // also bounds the construction: not too short under load
    o.retries = 2;
    DistributedOptimizer dist(a, {"SGD", {{"lr", 0.1}}}, {p1, p2}, o);
    GradContext ctx = a.new_context();
    (void)ctx.deposit_all({{p1, Tensor::full({1}, 1.0)}, {p2, Tensor::full({1}, 1.0)}});
    const std::string e = error_of([&] { dist.step(ctx); });
    SCHECK_THAT(e, Contains("TimeoutError") && Contains("1 of 2 owners failed") && Contains("'worker1' (rank 1)") &&
                       Contains("500 ms") && Contains("3 attempts"));
    {
      std::lock_guard<std::mutex> lock(g_gate_mutex);
      g_gate->set_value();
    }
    // The three requests ran as one step: after it (lrs() queues behind it
    // on the owner), p1 moved by exactly one SGD step.
    (void)dist.lrs();
    Tensor l1 = Tensor::from_vector(std::vector<float>{1});
    auto lopt = make_optimizer({"SGD", {{"lr", 0.1}}}, {OptimizerParamGroup({l1})});
    l1.set_grad(Tensor::full({1}, 1.0));
    lopt->step();
    SCHECK(bits_mismatch(p1.to_here(), l1) == "");
  });
  dopt::optim::detail::set_owner_step_hook({});
}

TEST_CASE("DistributedOptimizer: one schedule reaches all 3 remote owners (OneCycleLR with beta1, ChainedScheduler)",
          "[distributed_optimizer][lr_scheduler]") {
  register_test_functions();
  std::atomic<int> checked{0};
  rpc::simulate(4, [&](Agent& a) {
    if (a.rank() != 0) return;
    const std::vector<Shape> shapes{{7}, {2, 3}, {5}, {4}, {1}, {3}};
    std::vector<Tensor> local;
    std::vector<RRef<Tensor>> remote;
    for (std::size_t k = 0; k < shapes.size(); ++k) {
      const auto v = values<float>(static_cast<std::size_t>(shape_numel(shapes[k])), 70 + k);
      remote.push_back(a.remote<Tensor>(1 + static_cast<int>(k % 3), "dt.make_param", v, shapes[k]));
      local.push_back(Tensor::from_vector(v, shapes[k]));
    }
    // typed options, as for a local optimizer
    DistributedOptimizer dist(a, AdamOptions(0.01), remote);
    SCHECK(dist.owners().size() == 3u);
    Adam lopt(local, AdamOptions(0.01));
    OneCycleLROptions oc;
    oc.max_lr = {0.05};
    oc.total_steps = 8;
    OneCycleLR remote_sched(dist, oc), local_sched(lopt, oc);
    // the construction's values are already on every owner
    SCHECK(dist.lrs() == std::vector<double>(3, lopt.param_groups()[0].options->get_lr()));
    for (int t = 0; t < 8; ++t) {
      step_both(a, dist, lopt, remote, local, [&](std::size_t k) {
        return Tensor::from_vector(
            values<float>(static_cast<std::size_t>(shape_numel(shapes[k])), 900 + 10 * t + k, 2.0), shapes[k]);
      });
      remote_sched.step();
      local_sched.step();
      const double lr = lopt.param_groups()[0].options->get_lr();
      SCHECK(remote_sched.get_last_lr() == local_sched.get_last_lr());
      SCHECK(dist.lrs() == std::vector<double>(3, lr));  // every owner, asked by message
      SCHECK(dist.hyperparameters().at("betas") == lopt.param_groups()[0].options->to_hyperparams().at("betas"));
      for (std::size_t k = 0; k < shapes.size(); ++k) {
        const std::string m = bits_mismatch(remote[k].to_here(), local[k]);
        CatchLock l(g_catch_mutex);
        INFO("step " << t << " param " << k);
        CHECK(m == "");
        ++checked;
      }
    }
    // a composite on the same optimizer: one round of messages per step, all owners follow
    std::vector<std::unique_ptr<LRScheduler>> kids;
    kids.push_back(std::make_unique<ConstantLR>(dist, 0.5, 2));
    kids.push_back(std::make_unique<ExponentialLR>(dist, 0.9));
    ChainedScheduler chained(std::move(kids));
    chained.step();
    chained.step();
    SCHECK(dist.lrs() == std::vector<double>(3, chained.get_last_lr()[0]));
    // the state dict of a remote schedule restores like a local one
    const auto sd = chained.state_dict();
    SCHECK(std::get<double>(sd.at("_schedulers")) == 2.0);
  });
  CHECK(checked == 48);
}

// --- under the deterministic scheduler (rpc::simulate with deterministic = true) ------------

namespace {

rpc::SimulateOptions rpc_options(const SimulateOptions& o) {
  rpc::SimulateOptions r;
  r.deterministic = o.deterministic;
  r.seed = o.seed;
  r.faults = o.faults;
  r.report = o.report;
  r.keep_trace = o.keep_trace;
  return r;
}

/// Two trainers step one DistributedOptimizer each over parameters on two
/// owners; every parameter ends bitwise where the local optimizer puts it.
void two_trainers(const rpc::SimulateOptions& o) {
  register_test_functions();
  constexpr int kSteps = 3;
  std::atomic<int> checked{0};
  rpc::simulate(4, [&](Agent& a) {
    if (a.rank() < 2) return;  // owners 0 and 1 serve
    std::vector<RRef<Tensor>> ps;
    std::vector<Tensor> local;
    for (int k = 0; k < 3; ++k) {
      const auto v = values<float>(5, 10 * a.rank() + k);
      ps.push_back(a.remote<Tensor>(k % 2, "dt.make_param", v, std::vector<std::int64_t>{5}));
      local.push_back(Tensor::from_vector(v, {5}));
    }
    DistributedOptimizer dist(a, OptimizerSpec{"Adam", {{"lr", 0.01}}}, ps);
    auto lopt = make_optimizer(OptimizerSpec{"Adam", {{"lr", 0.01}}}, {OptimizerParamGroup(local)});
    for (int t = 0; t < kSteps; ++t)
      step_both(a, dist, *lopt, ps, local, [&](std::size_t k) {
        return Tensor::from_vector(values<float>(5, 100 * t + k + a.rank(), 2.0), {5});
      });
    for (std::size_t k = 0; k < ps.size(); ++k) {
      SCHECK(bits_mismatch(ps[k].to_here(), local[k]) == "");
      ++checked;
    }
  }, o);
  if (checked != 6) throw StateError("two_trainers", std::to_string(checked.load()) + " of 6 parameters checked");
}

}  // namespace

TEST_CASE("DistributedOptimizer under the deterministic scheduler: a swarm of seeds, each replayed exactly",
          "[distributed_optimizer][sim]") {
  sim::SwarmOptions so;
  so.seeds = 6;
  so.budget = std::chrono::seconds(60);
  so.print = false;
  SimulateOptions base;
  base.keep_trace = true;
  const auto found = sim::swarm([](const SimulateOptions& o) { two_trainers(rpc_options(o)); }, so, base);
  INFO(found.failure);
  CHECK_FALSE(found.failing_seed.has_value());
  CHECK(found.tried >= 1);
}

TEST_CASE("DistributedOptimizer under the deterministic scheduler: an owner crashed at its k-th call fails the "
          "step naming it",
          "[distributed_optimizer][sim]") {
  register_test_functions();
  for (int k : {3, 5, 7}) {  // 7 calls in all: make_param, create, lr, 4 steps
    SimReport report;
    rpc::SimulateOptions o;
    o.deterministic = true;
    o.seed = static_cast<std::uint64_t>(k);
    o.report = &report;
    o.faults.crash(2, k);  // owner 2: its calls are the ones it serves (create, lr, steps, ...)
    std::atomic<int> failed{0};
    rpc::simulate(3, [&](Agent& a) {
      if (a.rank() != 0) return;
      auto p1 = a.remote<Tensor>(1, "dt.make_param", std::vector<float>{1, 2}, std::vector<std::int64_t>{2});
      auto p2 = a.remote<Tensor>(2, "dt.make_param", std::vector<float>{3, 4}, std::vector<std::int64_t>{2});
      try {
        DistributedOptimizer dist(a, {"SGD", {{"lr", 0.1}}}, {p1, p2});
        for (int t = 0; t < 4; ++t) {
          GradContext ctx = a.new_context();
          (void)ctx.deposit_all({{p1, Tensor::full({2}, 1.0)}, {p2, Tensor::full({2}, 1.0)}});
          dist.step(ctx);
        }
      } catch (const Error& e) {
        SCHECK_THAT(std::string(e.what()), Contains("'worker2' (rank 2)"));
        SCHECK(rpc::error_kind(e) == "PeerLostError");
        ++failed;
      }
      // owner 1 still serves
      SCHECK(p1.to_here().numel() == 2);
    }, o);
    INFO("crash at call " << k);
    CHECK(failed == 1);
    REQUIRE(report.faults.size() == 1u);
    CHECK_THAT(report.faults[0], Contains("rank 2 crashed at its call " + std::to_string(k)));
  }
}
