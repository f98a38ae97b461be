// The RPC membership agreement (rpc_membership.hpp) over simulated workers
// (3 and 5): a lost worker is agreed lost by the survivors, who all commit
// the new epoch and members; a further agreement raises the epoch.
#include <catch2/catch.hpp>

#include "dopt/actors/rpc_membership.hpp"
#include "rpc/testing.hpp"

using namespace dopt;

TEST_CASE("rpc membership: the survivors agree on who is gone under a new epoch", "[rpc][membership]") {
  rpc::register_function("mt.epoch", [](rpc::Agent& a, std::uint64_t line) {
    return std::make_pair(rpc::membership_epoch(a, line), rpc::membership_members(a, line));
  });
  const int n = GENERATE(3, 5);
  // The agreement starts once the worker is killed (its thread may not even
  // have run yet on a loaded machine, and an agreement before the kill
  // rightly finds nobody lost).
  Promise<void> killed;
  rpc::simulate(n, [n, killed](rpc::Agent& a) {
    if (a.rank() == n - 1) {
      rpc::testing::kill(a);  // lost at once
      killed.set_value();
      return;
    }
    if (a.rank() != 0) return;
    killed.get_future().wait();
    std::vector<int> all;
    for (int r = 0; r < n; ++r) all.push_back(r);
    const std::uint64_t line = 77;
    CHECK_THROWS_AS(rpc::agree_membership(a, line, {1, 2}), ValueError);  // the coordinator must be a member
    rpc::Membership m = rpc::agree_membership(a, line, all);
    std::vector<int> alive(all.begin(), all.end() - 1);
    CHECK(m.epoch == 1);
    CHECK(m.members == alive);
    CHECK(m.lost == std::vector<int>{n - 1});
    for (int r : alive) {
      auto [e, members] = r == 0 ? std::make_pair(rpc::membership_epoch(a, line), rpc::membership_members(a, line))
                                 : a.rpc_sync<std::pair<std::uint64_t, std::vector<int>>>(r, "mt.epoch", line);
      CHECK(e == 1);
      CHECK(members == alive);
    }
    // Nothing more lost: the same members, a higher epoch.
    m = rpc::agree_membership(a, line, alive);
    CHECK(m.epoch == 2);
    CHECK(m.lost.empty());
    rpc::forget_membership(a, line);
    CHECK(rpc::membership_epoch(a, line) == 0);
  });
}
