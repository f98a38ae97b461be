// DistributedOptimizer with redundancy losing owners, over simulated workers
// (3 and 5): an owner lost before, at the beginning of, after the buddies
// applied, and after its step; two in a row; two at once with redundancy 2;
// an owner lost with its buddy. The scenarios and the reference run are in
// distributed_optimizer_survive_scenarios.hpp: the survivors' parameters
// must equal, bit for bit, one local optimizer applying the same gradients.
#include <catch2/catch.hpp>

#include <functional>
#include <mutex>

#include "distributed_optimizer_survive_scenarios.hpp"
#include "distributed_optimizer_testing.hpp"
#include "rpc/testing.hpp"

using namespace dopt;
using namespace dopt::optim;
using namespace dopt::do_survive_test;
using Catch::Matchers::Contains;

namespace {

Result run(const Scenario& sc) {
  die_fn() = [](rpc::Agent& a) { rpc::testing::kill(a); };
  install(sc);
  Result res;
  rpc::SimulateOptions so;
  so.rpc.rpc_timeout = std::chrono::seconds(30);
  so.rpc.shutdown_timeout = std::chrono::seconds(60);
  rpc::simulate(sc.n, [&](rpc::Agent& a) {
    if (a.rank() == 0) res = trainer(a, sc);
  }, so);
  optim::detail::set_owner_probe({});
  return res;
}

void check_bitwise(const Scenario& sc, const Result& got) {
  INFO("log: " << got.log << " error: " << got.error);
  REQUIRE(got.done);
  const auto ref = reference(sc);
  REQUIRE(got.params.size() == ref.size());
  for (std::size_t i = 0; i < ref.size(); ++i) {
    INFO("parameter " << i);
    CHECK(got.params[i] == ref[i]);
  }
  for (const auto& l : sc.losses) {
    CHECK_THAT(got.log, Contains("lost=") && Contains(std::to_string(l.victim)));
    for (int o : got.owners) CHECK(o != l.victim);
  }
}

/// Runs body on the trainer (rank 0) of sc.n simulated workers with a
/// DistributedOptimizer (redundancy 1) over sc's parameters, two per owner
/// (workers 1, 2, ...), and step(t), which deposits sc's gradients of step t
/// and steps. A worker told "dos.die" dies (rpc::testing::kill). Returns once
/// every worker is done; the owner probe is reset.
void on_trainer(const Scenario& sc,
                const std::function<void(rpc::Agent&, DistributedOptimizer&, const std::function<void(std::int64_t)>&)>&
                    body) {
  die_fn() = [](rpc::Agent& a) { rpc::testing::kill(a); };
  install(sc);
  rpc::simulate(sc.n, [&](rpc::Agent& a) {
    if (a.rank() != 0) return;
    std::vector<rpc::RRef<Tensor>> ps;
    for (std::size_t i = 0; i < num_params(sc); ++i)
      ps.push_back(a.remote<Tensor>(static_cast<int>(i / 2) + 1, "dos.make_param", static_cast<std::int64_t>(i)));
    DistributedOptimizerOptions o;
    o.redundancy = 1;
    DistributedOptimizer opt(a, spec(), ps, o);
    body(a, opt, [&](std::int64_t t) {
      rpc::GradContext ctx = a.new_context();
      const auto gs = grads_of(sc, t);
      for (std::size_t i = 0; i < gs.size(); ++i) (void)ctx.deposit(opt.parameters()[i], gs[i]);
      opt.step(ctx);
    });
  });
  optim::detail::set_owner_probe({});
}

}  // namespace

TEST_CASE("DistributedOptimizer survive: an owner lost before, during or after a step: bitwise the reference",
          "[distributed_optimizer][survive][survive_do]") {
  Scenario sc;
  sc.n = GENERATE(3, 5);
  const std::string point = GENERATE(std::string("before"), std::string("begin"), std::string("mirrored"),
                                     std::string("after"));
  sc.callback = GENERATE(false, true);
  const int victim = sc.n == 3 ? 2 : 3;
  sc.losses = {Loss{victim, 2, point}};
  INFO(sc.n << " workers, owner " << victim << " lost " << point << " step 2" << (sc.callback ? ", callback" : ""));
  const Result got = run(sc);
  check_bitwise(sc, got);
  // The victim's parameters (2(v-1), 2(v-1)+1) moved to its buddy; their
  // gradients had to be deposited again unless the buddy had applied the step.
  const std::string moved = "moved=" + std::to_string(2 * (victim - 1)) + "," + std::to_string(2 * victim - 1);
  CHECK_THAT(got.log, Contains(moved));
  if (point == "mirrored")
    CHECK_THAT(got.log, Contains("needs= step=3 completed"));
  else
    CHECK_THAT(got.log, Contains("needs=" + std::to_string(2 * (victim - 1)) + "," + std::to_string(2 * victim - 1)));
  CHECK_THAT(got.log, Contains(sc.callback ? "callback " : "changed "));
  // With 3 workers the buddy of owner 2 is owner 1; with 5, owner 3's is owner 4.
  CHECK(std::count(got.owners.begin(), got.owners.end(), sc.n == 3 ? 1 : 4) == 2);
}

TEST_CASE("DistributedOptimizer survive: no loss with redundancy 1 and 2 is bitwise the reference",
          "[distributed_optimizer][survive][survive_do]") {
  Scenario sc;
  sc.n = GENERATE(3, 5);
  sc.redundancy = sc.n == 5 ? 2 : 1;
  const Result got = run(sc);
  check_bitwise(sc, got);
  CHECK(got.log.empty());
}

TEST_CASE("DistributedOptimizer survive: two owners lost in a row, and two at once with redundancy 2",
          "[distributed_optimizer][survive][survive_do]") {
  Scenario sc;
  sc.n = 5;
  sc.callback = GENERATE(false, true);
  SECTION("owner 1 at the beginning of step 1, owner 3 before step 3") {
    sc.losses = {Loss{1, 1, "begin"}, Loss{3, 3, "before"}};
  }
  SECTION("owner 4 after the buddies applied step 1, owner 2 after step 2") {
    sc.losses = {Loss{4, 1, "mirrored"}, Loss{2, 2, "after"}};
  }
  SECTION("owners 2 and 3 before step 2, redundancy 2 (owner 2's copy on owner 4 takes over)") {
    sc.redundancy = 2;
    sc.losses = {Loss{2, 2, "before"}, Loss{3, 2, "before"}};
  }
  SECTION("owner 2 before step 2, then its buddy 3 while taking over (a loss during the recovery), redundancy 2") {
    sc.redundancy = 2;
    sc.losses = {Loss{2, 2, "before"}, Loss{3, 2, "promote"}};
  }
  check_bitwise(sc, run(sc));
}

TEST_CASE("DistributedOptimizer survive: an owner lost with its buddy names the state that is gone",
          "[distributed_optimizer][survive][survive_do]") {
  Scenario sc;
  sc.n = 5;
  std::string gone;
  SECTION("at once: owner 2 and its buddy 3") {
    sc.losses = {Loss{2, 2, "before"}, Loss{3, 2, "before"}};
    gone = "parameters 2, 3 (indices into parameters()) and their optimizer state, held by worker 'worker2' (rank 2)";
  }
  SECTION("in a row: owner 1 (its parameters go to 2), then owner 2, which had no buddy for them") {
    sc.losses = {Loss{1, 1, "before"}, Loss{2, 3, "before"}};
    gone = "parameters 0, 1 (indices into parameters()) and their optimizer state, held by worker 'worker2' (rank 2)";
  }
  const Result got = run(sc);
  INFO(got.log);
  CHECK_FALSE(got.done);
  CHECK_THAT(got.error, Contains("StateError") && Contains(gone) && Contains("is gone") &&
                            Contains("Fall back to the last checkpoint"));
}

TEST_CASE("DistributedOptimizer survive: refusals", "[distributed_optimizer][survive][survive_do]") {
  rpc::register_function("dos.make_param", [](std::int64_t i) { return initial_param(static_cast<std::size_t>(i)); });
  rpc::simulate(3, [](rpc::Agent& a) {
    if (a.rank() != 0) return;
    std::vector<rpc::RRef<Tensor>> one{a.remote<Tensor>(1, "dos.make_param", std::int64_t(0))};
    DistributedOptimizerOptions o;
    o.redundancy = 1;
    CHECK_THROWS_AS(DistributedOptimizer(a, spec(), one, o), ValueError);
    o.redundancy = -1;
    CHECK_THROWS_AS(DistributedOptimizer(a, spec(), one, o), ValueError);
    DistributedOptimizer plain(a, spec(), one);
    CHECK_THROWS_AS(plain.recover(), StateError);
    std::vector<rpc::RRef<Tensor>> two{one[0], a.remote<Tensor>(2, "dos.make_param", std::int64_t(1))};
    o.redundancy = 1;
    DistributedOptimizer r(a, spec(), two, o);
    const OwnerRecovery rec = r.recover();  // nothing lost: nothing moves
    CHECK(rec.lost.empty());
    CHECK(rec.moved.empty());
  });
}

TEST_CASE("DistributedOptimizer survive: learning-rate changes reach the copies, set_lr recovers from a lost owner",
          "[distributed_optimizer][survive][survive_do]") {
  Scenario sc;
  sc.n = 5;
  std::vector<std::vector<unsigned char>> got;
  std::string log;
  on_trainer(sc, [&](rpc::Agent& a, DistributedOptimizer& opt, const std::function<void(std::int64_t)>& step) {
    auto kill = [&](int v) {
      (void)a.rpc_async(v, "dos.die");
      REQUIRE(a.wait_until_lost(v, std::chrono::seconds(20)));
    };
    step(0);
    opt.set_lr(0.005);  // reaches owner 2's copy on owner 3
    step(1);
    kill(2);
    try {
      opt.set_hyperparameters({{"lr", 0.002}});  // notices the loss, recovers, completes
      log += "no error;";
    } catch (const OwnersChangedError& e) {
      log += "changed " + describe(e.owner_recovery());
      CHECK_FALSE(e.recovery().step_completed);
    }
    for (double lr : opt.lrs()) CHECK(lr == 0.002);
    CHECK(std::get<double>(opt.hyperparameters().at("lr")) == 0.002);
    step(2);  // owner 2's parameters stepped by the copy at lr 0.002 (set through the copy)
    kill(4);
    try {
      step(3);
    } catch (const OwnersChangedError& e) {
      log += "changed " + describe(e.owner_recovery());
      REQUIRE_FALSE(e.recovery().step_completed);
      step(3);
    }
    for (const auto& p : opt.parameters()) got.push_back(bytes_of(p.to_here()));
  });
  INFO(log);
  CHECK_THAT(log, Contains("changed lost=2 moved=2,3 needs= step=2;") && Contains("changed lost=4 moved=6,7 needs=6,7 step=3;"));
  // The reference: the same gradients and learning rates, in one optimizer.
  std::vector<Tensor> ps;
  for (std::size_t i = 0; i < num_params(sc); ++i) ps.push_back(initial_param(i));
  auto ref = make_functional(spec(), ps);
  ref->step(grads_of(sc, 0));
  ref->set_lr(0.005);
  ref->step(grads_of(sc, 1));
  ref->set_lr(0.002);
  ref->step(grads_of(sc, 2));
  ref->step(grads_of(sc, 3));
  REQUIRE(got.size() == ps.size());
  for (std::size_t i = 0; i < ps.size(); ++i) {
    INFO("parameter " << i);
    CHECK(got[i] == bytes_of(ps[i]));
  }
}

TEST_CASE("DistributedOptimizer survive: recover() after a loss the trainer saw in its own call",
          "[distributed_optimizer][survive][survive_do]") {
  Scenario sc;
  sc.n = 3;
  std::vector<std::vector<unsigned char>> got;
  on_trainer(sc, [&](rpc::Agent& a, DistributedOptimizer& opt, const std::function<void(std::int64_t)>& step) {
    step(0);
    (void)a.rpc_async(1, "dos.die");
    REQUIRE(a.wait_until_lost(1, std::chrono::seconds(20)));
    CHECK_THROWS_AS(opt.parameters()[0].to_here(), PeerLostError);  // the trainer's forward, say
    const OwnerRecovery r = opt.recover();
    CHECK(r.lost.size() == 1);
    CHECK(r.lost.at(0).rank == 1);
    CHECK(r.moved == std::vector<std::size_t>{0, 1});
    CHECK(r.needs_gradient.empty());
    CHECK_FALSE(r.step_completed);
    CHECK(r.step == 1);
    CHECK(opt.parameters()[0].owner_rank() == 2);
    CHECK(opt.owners() == std::vector<rpc::WorkerInfo>{a.worker_info(2), a.worker_info(2)});
    step(1);  // no recovery: nothing more is lost
    for (const auto& p : opt.parameters()) got.push_back(bytes_of(p.to_here()));
  });
  sc.steps = 2;
  CHECK(got == reference(sc));
}
