// DistributedOptimizer's errors name the user's call and the owner, the
// internal function second: a step whose owner dies names
// "DistributedOptimizer::step() on worker ..." (internally 'dopt.optim.step').
// 3 and 5 simulated workers.
#include <catch2/catch.hpp>

#include <mutex>
#include <string>
#include <vector>

#include "distributed_optimizer_testing.hpp"
#include "dopt/actors/rpc.hpp"
#include "dopt/distributed/distributed_optimizer.hpp"
#include "rpc/testing.hpp"
#include "rpc_errors.hpp"
#include "served_checks.hpp"

using namespace dopt;
using namespace dopt::optim;
using dopt::rpc::Agent;
using dopt::rpc::GradContext;
using dopt::rpc::RRef;
using dopt::testing::error_of;
using Catch::Matchers::Contains;

namespace {

void register_error_functions() {
  static std::once_flag once;
  std::call_once(once, [] {
    rpc::register_function("de.make_param", [](int n) { return Tensor::full({n}, 1.0); });
  });
}

}  // namespace

TEST_CASE("DistributedOptimizer: a step whose owner dies names DistributedOptimizer::step() and the owner",
          "[distributed_optimizer][call_label]") {
  register_error_functions();
  const int n = GENERATE(3, 5);
  const int victim = n - 1;
  dopt::optim::detail::set_owner_step_hook([victim](Agent& a, long step) {
    if (a.rank() == victim && step == 0) rpc::testing::kill(a);
  });
  rpc::simulate(n, [n, victim](Agent& a) {
    if (a.rank() != 0) return;
    std::vector<RRef<Tensor>> ps;
    for (int r = 1; r < n; ++r) ps.push_back(a.remote<Tensor>(r, "de.make_param", 2));
    DistributedOptimizer dist(a, {"SGD", {{"lr", 0.1}}}, ps);
    GradContext ctx = a.new_context();
    std::vector<std::pair<RRef<Tensor>, Tensor>> deps;
    for (auto& p : ps) deps.emplace_back(p, Tensor::full({2}, 1.0));
    (void)ctx.deposit_all(deps);
    const std::string e = error_of([&] { dist.step(ctx); });
    const std::string owner = "worker 'worker" + std::to_string(victim) + "' (rank " + std::to_string(victim) + ")";
    SERVED_CHECK_THAT(e, Contains("PeerLostError") &&
                       Contains("DistributedOptimizer::step() on " + owner + " (internally 'dopt.optim.step') from "
                                "worker 'worker0' (rank 0) failed: " + owner));
  });
  dopt::optim::detail::set_owner_step_hook({});
}
