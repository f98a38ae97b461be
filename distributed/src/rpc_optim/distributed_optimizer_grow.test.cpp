// DistributedOptimizer growing back (distributed_optimizer_catch_up), over
// simulated workers: worlds of 3 and 5 workers (the trainer and 2 or 4
// owners) and standby workers; an owner lost at step k, a standby worker
// joining at step k + j and taking the lost owner's slot from its holder; the
// buddies rebuilt (a later loss of the holder or of the newcomer is survived);
// with Adam and SGD with momentum. The scenarios and the reference run are in
// distributed_optimizer_grow_scenarios.hpp: the final parameters must equal,
// bit for bit, one local optimizer applying the same gradients. Under the
// sim swarm (DOPT_SIM_SEED) these run on the deterministic scheduler.
#include <algorithm>
#include <catch2/catch.hpp>

#include "distributed_optimizer_grow_scenarios.hpp"
#include "distributed_optimizer_testing.hpp"
#include "rpc/testing.hpp"

using namespace dopt;
using namespace dopt::optim;
using namespace dopt::do_grow_test;
using Catch::Matchers::Contains;

namespace {

Result run(const Plan& p, bool deterministic = false, std::uint64_t seed = 0) {
  do_survive_test::die_fn() = [](rpc::Agent& a) { rpc::testing::kill(a); };
  install(p);
  Result res;
  rpc::SimulateOptions so;
  so.rpc.rpc_timeout = std::chrono::seconds(30);
  so.rpc.shutdown_timeout = std::chrono::seconds(60);
  so.deterministic = deterministic;
  so.seed = seed;
  rpc::simulate(
      p.n + p.standby,
      [&](rpc::Agent& a) {
        if (a.rank() == 0) res = trainer(a, p);
      },
      so);
  optim::detail::set_owner_probe({});
  return res;
}

void check_bitwise(const Plan& p, const Result& got) {
  INFO("log: " << got.log << " error: " << got.error);
  REQUIRE(got.done);
  const auto ref = reference(p);
  REQUIRE(got.params.size() == ref.size());
  for (std::size_t i = 0; i < ref.size(); ++i) {
    INFO("parameter " << i);
    CHECK(got.params[i] == ref[i]);
  }
  for (const auto& l : p.losses)
    for (int o : got.owners) CHECK(o != l.victim);
  for (double lr : got.lrs_joined) CHECK(lr == kLrAt1);  // the holder sent its hyperparameters
}

std::string name_of(const OptimizerSpec& s) { return s.name == "SGD" ? "SGD with momentum" : s.name; }

}  // namespace

TEST_CASE(
    "DistributedOptimizer grow back: a standby worker takes a lost owner's slot, then the holder is lost: "
    "bitwise the reference",
    "[distributed_optimizer][survive][grow][grow_do]") {
  Plan p;
  p.n = GENERATE(3, 5);
  p.spec = GENERATE(OptimizerSpec{"Adam", {{"lr", 0.01}, {"weight_decay", 0.001}}}, sgd_momentum());
  const std::string point = GENERATE(std::string("begin"), std::string("after"));
  p.callback = GENERATE(false, true);
  // 3 workers: owner 2 lost, owner 1 holds both slots without a buddy; 5
  // workers: owner 3 lost, owner 4 holds its slot without a buddy. The
  // standby worker (rank n) takes the slot at step 4; the holder is lost
  // at step 5, which only the rebuilt buddies survive.
  const int victim = p.n == 3 ? 2 : 3;
  const int holder = p.n == 3 ? 1 : 4;
  p.losses = {Loss{victim, 2, point}, Loss{holder, 5, "before"}};
  p.join_at = 4;
  p.newcomers = {p.n};
  INFO(p.n << " workers, " << name_of(p.spec) << ", owner " << victim << " lost '" << point << "' of step 2"
           << (p.callback ? ", callback" : ""));
  const Result got = run(p);
  check_bitwise(p, got);
  const std::string slot = std::to_string(2 * (victim - 1)) + "," + std::to_string(2 * victim - 1);
  CHECK_THAT(got.log, Contains("joined=" + std::to_string(p.n) + " lost= moved=" + slot + " needs= step=4;"));
  if (p.callback) CHECK_THAT(got.log, Contains("callback joined=" + std::to_string(p.n)));
  // Right after the join: the newcomer holds the lost owner's slot.
  const std::vector<int> joined = p.n == 3 ? std::vector<int>{1, 3} : std::vector<int>{1, 2, 5, 4};
  CHECK(got.owners_joined == joined);
  // The holder lost at step 5: its slots go to their rebuilt buddies (3 workers:
  // ring 1, 3, so slot 0's buddy is the newcomer; 5 workers: ring 1, 2, 4, 5,
  // slot 3's buddy is the newcomer).
  const std::vector<int> end = p.n == 3 ? std::vector<int>{3, 3} : std::vector<int>{1, 2, 5, 5};
  CHECK(got.owners == end);
  CHECK_THAT(got.log, Contains("lost=" + std::to_string(holder) + " moved="));
}

TEST_CASE("DistributedOptimizer grow back: two newcomers for two lost owners, then a newcomer lost",
          "[distributed_optimizer][survive][grow][grow_do]") {
  Plan p;
  p.n = 5;
  p.standby = 2;
  p.spec = GENERATE(OptimizerSpec{"Adam", {{"lr", 0.01}, {"weight_decay", 0.001}}}, sgd_momentum());
  p.callback = GENERATE(false, true);
  SECTION("redundancy 1: owners 1 and 3 lost, newcomers 5 and 6 at step 4, newcomer 5 lost in step 5") {
    p.losses = {Loss{1, 1, "begin"}, Loss{3, 2, "mirrored"}, Loss{5, 5, "begin"}};
    p.newcomers = {5, 6};
    const Result got = run(p);
    check_bitwise(p, got);
    CHECK_THAT(got.log, Contains("joined=5,6 lost= moved=0,1,4,5 needs= step=4;"));
    CHECK(got.owners_joined == std::vector<int>{5, 2, 6, 4});
    // ring 2, 4, 5, 6: newcomer 5's buddy is newcomer 6
    CHECK(got.owners == std::vector<int>{6, 2, 6, 4});
  }
  SECTION("redundancy 2: owners 2 and 3 lost at once, one newcomer (5) at step 3 for the first vacant slot") {
    p.redundancy = 2;
    p.losses = {Loss{2, 2, "before"}, Loss{3, 2, "before"}, Loss{5, 4, "after"}};
    p.newcomers = {5};
    p.join_at = 3;
    const Result got = run(p);
    check_bitwise(p, got);
    CHECK_THAT(got.log, Contains("joined=5 lost= moved=2,3 needs= step=3;"));
    // slot 1 (owner 2's) to the newcomer; slot 2 (owner 3's) stays with the buddy that took it (4)
    CHECK(got.owners_joined == std::vector<int>{1, 5, 4, 4});
    CHECK(std::count(got.owners.begin(), got.owners.end(), 5) == 0);
  }
}

TEST_CASE(
    "DistributedOptimizer grow back: a newcomer lost while it adopts its slot changes nothing, the next one "
    "takes it",
    "[distributed_optimizer][survive][grow][grow_do]") {
  Plan p;
  p.n = GENERATE(3, 5);
  p.standby = 2;
  const int victim = p.n == 3 ? 2 : 3;
  p.losses = {Loss{victim, 2, "before"}};
  p.newcomers = {p.n};
  p.dies_adopting = p.n;
  const Result got = run(p);
  check_bitwise(p, got);
  CHECK_THAT(got.log, Contains("catch_up failed: ") && Contains("nothing changed"));
  CHECK_THAT(got.log, Contains("returned joined=" + std::to_string(p.n + 1) + " "));
  CHECK(std::count(got.owners.begin(), got.owners.end(), p.n + 1) == 1);
  CHECK(std::count(got.owners.begin(), got.owners.end(), p.n) == 0);
}

TEST_CASE(
    "DistributedOptimizer grow back: an owner lost right before the call is taken over first, also when the "
    "newcomer is then lost adopting its slot",
    "[distributed_optimizer][survive][grow][grow_do]") {
  // The owner is lost after step 3 and no step notices it before the
  // catch-up at step 4: the catch-up's membership takes it over, then gives
  // its slot to the newcomer. When the newcomer dies adopting the slot, the
  // error says that the lost owner moved to its buddy (not "nothing changed"),
  // and the callback heard of that takeover once, before the error.
  Plan p;
  p.n = GENERATE(3, 5);
  p.callback = GENERATE(false, true);
  const bool newcomer_lost = GENERATE(false, true);
  const int victim = p.n == 3 ? 2 : 3;
  p.losses = {Loss{victim, 3, "after"}};
  p.newcomers = {p.n};
  if (newcomer_lost) {
    p.standby = 2;
    p.dies_adopting = p.n;
  }
  INFO(p.n << " workers" << (newcomer_lost ? ", the newcomer lost adopting" : ""));
  const Result got = run(p);
  check_bitwise(p, got);
  const std::string slot = std::to_string(2 * (victim - 1)) + "," + std::to_string(2 * victim - 1);
  if (!newcomer_lost) {
    CHECK_THAT(got.log, Contains("returned joined=" + std::to_string(p.n) + " lost=" + std::to_string(victim) +
                                 " moved=" + slot + " needs= step=4;"));
  } else {
    CHECK_THAT(got.log,
               Contains("catch_up failed: ") && Contains("no slot went to a newcomer, but the owners worker 'worker" +
                                                         std::to_string(victim) + "'"));
    CHECK_THAT(got.log, !Contains("nothing changed"));
    CHECK_THAT(got.log, Contains("returned joined=" + std::to_string(p.n + 1) + " lost= moved=" + slot));
    if (p.callback) {
      const std::string report = "callback lost=" + std::to_string(victim) + " moved=" + slot + " needs= step=4;";
      const auto at = got.log.find(report);
      REQUIRE(at != std::string::npos);
      CHECK(at < got.log.find("catch_up failed: "));
      CHECK(got.log.find(report, at + 1) == std::string::npos);  // once
      CHECK(got.log.find("callback lost=") == at);
    }
  }
}

TEST_CASE(
    "DistributedOptimizer grow back: the slot's holder lost while it hands the slot over changes nothing, the "
    "catch-up after the next step works",
    "[distributed_optimizer][survive][grow][grow_do]") {
  // 5 workers, redundancy 2: owner 3 lost in step 2, its slot taken by 4 (its
  // copy on 1 stays); 4 dies as it starts handing the slot to the standby
  // worker 5 at step 4 ("hand_over"), or while 5 builds the slot's owner
  // ("adopting": 5 sees 4 lost before it replies); step 4 takes both 3's and
  // 4's slots over on 1; the catch-up after it gives 5 the first vacant slot
  // (3's), from 1. The standby worker holds nothing in between (an owner left
  // there by the failed hand-over is gone). Not with 3 workers: there the
  // holder is the last owner, its loss loses the state.
  Plan p;
  p.n = 5;
  p.redundancy = 2;
  p.spec = GENERATE(OptimizerSpec{"Adam", {{"lr", 0.01}, {"weight_decay", 0.001}}}, sgd_momentum());
  const std::string point = GENERATE(std::string("hand_over"), std::string("adopting"));
  INFO("the holder lost at '" << point << "'");
  p.losses = {Loss{3, 2, "begin"}, Loss{4, 4, point}};
  p.newcomers = {5};
  const Result got = run(p);
  check_bitwise(p, got);
  CHECK_THAT(got.log, Contains("catch_up failed: ") && Contains("nothing changed"));
  CHECK_THAT(got.log, Contains("standby 5 owns 0;"));
  CHECK(got.owners_failed == std::vector<int>{1, 2, 4, 4});
  CHECK_THAT(got.log,
             Contains("changed lost=4 moved=") && Contains("returned joined=5 lost= moved=4,5 needs= step=5;"));
  CHECK(got.owners_joined == std::vector<int>{1, 2, 5, 1});
}

TEST_CASE(
    "DistributedOptimizer grow back: an owner refusing its rebuilt buddies rolls the catch-up back, the catch-up "
    "after the next step works",
    "[distributed_optimizer][survive][grow][grow_do]") {
  // The standby worker (rank n) takes the lost owner's slot at step 4, but
  // one owner (the newcomer itself, or owner 1) refuses the buddies the
  // catch-up sets (StateError, not a loss): the catch-up rolls back (the
  // newcomer is not a member, every owner keeps its slot and buddies), step 4
  // runs as before the call, the catch-up after it takes the slot; the holder
  // lost at step 6 is survived by the rebuilt buddies.
  Plan p;
  p.n = GENERATE(3, 5);
  p.spec = GENERATE(OptimizerSpec{"Adam", {{"lr", 0.01}, {"weight_decay", 0.001}}}, sgd_momentum());
  p.callback = GENERATE(false, true);
  const bool newcomer_refuses = GENERATE(true, false);
  p.refuses_mirrors = newcomer_refuses ? p.n : 1;
  const int victim = p.n == 3 ? 2 : 3;
  const int holder = p.n == 3 ? 1 : 4;
  p.losses = {Loss{victim, 2, "begin"}, Loss{holder, 6, "before"}};
  p.newcomers = {p.n};
  INFO(p.n << " workers, " << name_of(p.spec) << ", worker " << p.refuses_mirrors << " refuses"
           << (p.callback ? ", callback" : ""));
  const Result got = run(p);
  check_bitwise(p, got);
  CHECK_THAT(got.log, Contains("catch_up failed: StateError: distributed_optimizer_catch_up [rank 0]: setting the "
                               "rebuilt buddies on the owners failed (") &&
                          Contains("refused by the test") &&
                          Contains("rolled back: worker 'worker" + std::to_string(p.n) + "' (rank " +
                                   std::to_string(p.n) + ") is not a member"));
  // Right after the failure: the owners of before the call; the standby holds nothing.
  const std::vector<int> before = p.n == 3 ? std::vector<int>{1, 1} : std::vector<int>{1, 2, 4, 4};
  CHECK(got.owners_failed == before);
  CHECK_THAT(got.log, Contains("standby " + std::to_string(p.n) + " owns 0;"));
  const std::string slot = std::to_string(2 * (victim - 1)) + "," + std::to_string(2 * victim - 1);
  CHECK_THAT(got.log, Contains("returned joined=" + std::to_string(p.n) + " lost= moved=" + slot + " needs= step=5;"));
  const std::vector<int> joined = p.n == 3 ? std::vector<int>{1, 3} : std::vector<int>{1, 2, 5, 4};
  CHECK(got.owners_joined == joined);
  const std::vector<int> end = p.n == 3 ? std::vector<int>{3, 3} : std::vector<int>{1, 2, 5, 5};
  CHECK(got.owners == end);
}

TEST_CASE("DistributedOptimizer grow back: under the deterministic scheduler, seeds 1 to 3",
          "[distributed_optimizer][survive][grow][grow_do]") {
  Plan p;
  p.n = GENERATE(3, 5);
  const int victim = p.n == 3 ? 2 : 3;
  const int holder = p.n == 3 ? 1 : 4;
  p.losses = {Loss{victim, 2, "begin"}, Loss{holder, 5, "mirrored"}};
  p.newcomers = {p.n};
  for (std::uint64_t seed = 1; seed <= 3; ++seed) {
    INFO("seed " << seed);
    check_bitwise(p, run(p, true, seed));
  }
}

TEST_CASE("DistributedOptimizer grow back: refusals", "[distributed_optimizer][survive][grow][grow_do]") {
  do_survive_test::die_fn() = [](rpc::Agent& a) { rpc::testing::kill(a); };
  do_survive_test::install(do_survive_test::Scenario{});
  rpc::simulate(5, [](rpc::Agent& a) {
    if (a.rank() != 0) return;
    std::vector<rpc::RRef<Tensor>> ps;
    for (int i = 0; i < 3; ++i) ps.push_back(a.remote<Tensor>(i + 1, "dos.make_param", std::int64_t(i)));
    const auto spec = do_survive_test::spec();
    auto error_of = [](DistributedOptimizer& opt, const std::vector<rpc::To>& n) {
      try {
        (void)distributed_optimizer_catch_up(opt, n);
      } catch (const Error& e) {
        return rpc::error_kind(e) + ": " + e.what();
      }
      return std::string("no error");
    };
    DistributedOptimizer plain(a, spec, ps);
    CHECK_THAT(error_of(plain, {4}), Contains("NotSupportedError") && Contains("distributed_optimizer_catch_up") &&
                                         Contains("no redundancy"));
    DistributedOptimizerOptions o;
    o.redundancy = 1;
    DistributedOptimizer r(a, spec, ps, o);
    auto what = [&](const std::vector<rpc::To>& n) { return error_of(r, n); };
    CHECK_THAT(what({4}), Contains("NotSupportedError") && Contains("1 newcomer, but 0 vacant slots"));
    CHECK_THAT(what({}), Contains("ValueError") && Contains("no newcomers"));
    CHECK_THAT(what({0}), Contains("ValueError") && Contains("is the trainer"));
    CHECK_THAT(what({2}), Contains("ValueError") && Contains("already an owner or a buddy"));
    CHECK_THAT(what({"worker4", 4}), Contains("ValueError") && Contains("named twice"));
    CHECK_THAT(what({"nobody"}), Contains("ValueError") && Contains("not a worker of this RPC world"));
    (void)a.rpc_async(3, "dos.die");
    REQUIRE(a.wait_until_lost(3, std::chrono::seconds(20)));
    CHECK_THAT(what({3}), Contains("PeerLostError") && Contains("cannot come back"));
    CHECK(what({4}) == "no error");  // one vacant slot now: owner 3's, taken over by its buddy 1 first
    CHECK(r.owners() == std::vector<rpc::WorkerInfo>{a.worker_info(1), a.worker_info(2), a.worker_info(4)});
    CHECK_THAT(what({4}), Contains("already an owner"));
  });
  optim::detail::set_owner_probe({});
}
