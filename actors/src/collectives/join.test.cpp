// Join / Joinable / JoinHook over simulated ranks (torch's test_join.py
// scenarios). Rank functions record what they saw; the test thread asserts
// after simulate() returned. Every simulate uses a short group timeout, so a
// protocol bug fails the test instead of hanging it.
#include <catch2/catch.hpp>

#include <atomic>
#include <mutex>
#include <string>
#include <vector>

#include "dopt/actors/join.hpp"
#include "dopt/actors/simulate.hpp"
#include "sim_timeout.hpp"

using namespace dopt;

namespace {

SimulateOptions short_timeout() { return dopt::testing::with_timeout(std::chrono::seconds(20)); }

// A joinable doing `n` all-reduces of 1 per input; its hook shadows them with
// all-reduces of 0; its post hook tells every rank who the last joiner was.
class Toy : public Joinable {
 public:
  Toy(ProcessGroup g, int n) : group_(std::move(g)), n_(n) {}

  void iteration() {
    Join::notify_join_context(*this).get();
    for (int k = 0; k < n_; ++k) {
      Tensor t = Tensor::full({1}, 1.0);
      group_.all_reduce(t);
      total += static_cast<long>(t.item());
    }
  }

  std::unique_ptr<JoinHook> join_hook() override { return std::make_unique<Hook>(*this); }
  Device join_device() const override { return Device::cpu(); }
  ProcessGroup join_process_group() const override { return group_; }

  long total = 0;
  int main_hooks = 0;
  int post_hooks = 0;
  int last_joiner = -1;

 private:
  struct Hook : JoinHook {
    explicit Hook(Toy& t) : toy(t) {}
    void main_hook() override {
      ++toy.main_hooks;
      for (int k = 0; k < toy.n_; ++k) {
        Tensor t = Tensor::zeros({1});
        toy.group_.all_reduce(t);
      }
    }
    void post_hook(bool is_last_joiner) override {
      ++toy.post_hooks;
      Tensor t = Tensor::full({1}, is_last_joiner ? toy.group_.rank() + 1.0 : 0.0);
      toy.group_.all_reduce(t, ReduceOp::max);
      toy.last_joiner = static_cast<int>(t.item()) - 1;
    }
    Toy& toy;
  };
  ProcessGroup group_;
  int n_;
};

// Ranks r with more than k inputs, where rank r has 3 + r inputs.
long active_at(int world, int k) {
  long n = 0;
  for (int r = 0; r < world; ++r) n += (3 + r > k);
  return n;
}

}  // namespace

TEST_CASE("Join: uneven inputs, main hooks shadow the collectives, post hooks see the last joiner", "[join]") {
  for (int world : {1, 2, 3, 5}) {
    for (int n_allreduce : {1, 3}) {
      INFO("world " << world << ", all-reduces per input " << n_allreduce);
      std::vector<long> totals(world), mains(world), posts(world), last(world), iters(world);
      REQUIRE_NOTHROW(simulate(world, [&](RankContext& ctx) {
        const int r = ctx.rank();
        Toy toy(ctx.world(), n_allreduce);
        Join join({&toy});
        for (int k = 0; k < 3 + r; ++k) toy.iteration();
        join.finish();
        totals[r] = toy.total, mains[r] = toy.main_hooks, posts[r] = toy.post_hooks, last[r] = toy.last_joiner;
        iters[r] = join.iterations();
      }, short_timeout()));
      for (int r = 0; r < world; ++r) {
        long expected = 0;
        for (int k = 0; k < 3 + r; ++k) expected += active_at(world, k) * n_allreduce;
        CHECK(totals[r] == expected);
        CHECK(mains[r] == (world - 1 - r));  // the rank with most inputs never loops
        CHECK(iters[r] == mains[r]);
        CHECK(posts[r] == 1);
        CHECK(last[r] == world - 1);
      }
    }
  }
}

TEST_CASE("Join: several joinables, only the first notifies", "[join]") {
  const int world = 3;
  std::vector<long> totals(world * 3);
  REQUIRE_NOTHROW(simulate(world, [&](RankContext& ctx) {
    const int r = ctx.rank();
    Toy a(ctx.world(), 1), b(ctx.world(), 2), c(ctx.world(), 1);
    Join join({&a, &b, &c});
    for (int k = 0; k < 3 + r; ++k) {
      a.iteration();
      b.iteration();  // not first: its notify is a no-op
      c.iteration();
    }
    join.finish();
    totals[3 * r] = a.total, totals[3 * r + 1] = b.total, totals[3 * r + 2] = c.total;
  }, short_timeout()));
  for (int r = 0; r < world; ++r) {
    long base = 0;
    for (int k = 0; k < 3 + r; ++k) base += active_at(world, k);
    CHECK(totals[3 * r] == base);
    CHECK(totals[3 * r + 1] == 2 * base);
    CHECK(totals[3 * r + 2] == base);
  }
}

TEST_CASE("Join: enable=false with even inputs does nothing collective", "[join]") {
  std::vector<long> totals(3);
  REQUIRE_NOTHROW(simulate(3, [&](RankContext& ctx) {
    Toy toy(ctx.world(), 1);
    Join join({&toy}, JoinOptions{false, false});
    for (int k = 0; k < 4; ++k) toy.iteration();
    join.finish();
    totals[ctx.rank()] = toy.total + 100 * toy.main_hooks + 1000 * toy.post_hooks;
  }, short_timeout()));
  for (long t : totals) CHECK(t == 12);
}

TEST_CASE("Join: throw_on_early_termination throws on every rank", "[join]") {
  const int world = 3;
  std::vector<std::string> msgs(world);
  std::vector<int> kinds(world, 0);
  REQUIRE_NOTHROW(simulate(world, [&](RankContext& ctx) {
    const int r = ctx.rank();
    Toy toy(ctx.world(), 1);
    Join join({&toy}, JoinOptions{true, true});
    try {
      const int inputs = r == 0 ? 2 : 4;
      for (int k = 0; k < inputs; ++k) toy.iteration();
      join.finish();
    } catch (const EarlyTerminationError& e) {
      msgs[r] = e.what();
      kinds[r] = 1;
    }
  }, short_timeout()));
  for (int r = 0; r < world; ++r) {
    INFO("rank " << r << ": " << msgs[r]);
    CHECK(kinds[r] == 1);
    if (r == 0) CHECK(msgs[r].find("Rank 0 exhausted all inputs.") != std::string::npos);
    else CHECK(msgs[r].find("Detected at least one rank that exhausted inputs. Throwing across all ranks.") !=
               std::string::npos);
  }
}

TEST_CASE("Join: the configuration is disabled after finish and on destruction", "[join]") {
  std::atomic<int> ok{0};
  REQUIRE_NOTHROW(simulate(2, [&](RankContext& ctx) {
    Toy toy(ctx.world(), 1);
    {
      Join join({&toy});
      if (toy.join_config().enable && toy.join_config().is_first_joinable) ++ok;
      toy.iteration();
      join.finish();
      if (!toy.join_config().enable) ++ok;
      bool threw = false;
      try {
        join.finish();
      } catch (const StateError&) {
        threw = true;
      }
      if (threw) ++ok;
    }
    { Join unused({&toy}); }
    if (!toy.join_config().enable) ++ok;
    // No Join: notify is a ready no-op, so ranks may call it unevenly.
    if (ctx.rank() == 0)
      if (Join::notify_join_context(toy).is_ready()) ++ok;
  }, short_timeout()));
  CHECK(ok == 9);
}

TEST_CASE("Join: argument errors", "[join]") {
  std::vector<std::string> errs(2);
  REQUIRE_NOTHROW(simulate(2, [&](RankContext& ctx) {
    const int r = ctx.rank();
    try {
      Join j(std::vector<Joinable*>{});
    } catch (const ValueError& e) {
      errs[r] += std::string(e.what()).find("requires at least one joinable") != std::string::npos ? "a" : "?";
    }
    Toy a(ctx.world(), 1);
    try {
      Join j({&a, &a});
    } catch (const ValueError&) {
      errs[r] += "b";
    }
    // new_group is a world collective: both ranks create both groups in the same order.
    ProcessGroup g0 = ctx.world().new_group({0});
    ProcessGroup g1 = ctx.world().new_group({1});
    Toy b(r == 0 ? g0 : g1, 1);
    try {
      Join j({&a, &b});
    } catch (const ValueError& e) {
      errs[r] += std::string(e.what()).find("multiple process groups") != std::string::npos ? "c" : "?";
      // The rank is known once the first joinable's group is: the error names it.
      errs[r] += e.rank() == r && std::string(e.what()).find("[rank " + std::to_string(r) + "]") != std::string::npos
                     ? "r" : "?";
    }
  }, short_timeout()));
  CHECK(errs[0] == "abcr");
  CHECK(errs[1] == "abcr");
}
