// PostLocalSGDOptimizer and the Reducer surviving a lost rank, over simulated
// ranks (3 and 5): a rank is lost before, during and after the averaging (the
// bucket reduce) of a step, the survivors shrink and go on, and their final
// parameters are compared bitwise with a reference run.
//
// The reference run: the same ranks, the same data, no crash; at step C (the
// step at which the survivors' recovery applies the membership change, below)
// every rank, the lost one included, calls world.new_group(survivors); the lost
// rank then returns, and the survivors average on that subgroup from step C
// on (the post-local SGD averager's all-reduce, or a Reducer built over the
// subgroup), exactly as they averaged on the world before. C is
//   * post-local SGD (averaging at steps 1, 3, 5): the first averaging step
//     >= t for a rank lost before or during step t, > t for one lost after
//     step t's averaging (local steps never communicate: the loss is noticed
//     at the next average, whose all-reduce is then redone over the
//     survivors from the parameters as every survivor contributed them);
//   * Reducer: t for a rank lost before or during step t's bucket reduce
//     (every bucket of step t is reduced again over the survivors), t + 1 for
//     one lost after it.
// The lost rank "during" posts part of its collectives (the post-local SGD
// average of its float32 parameters but not of its float64 one; the reducer
// bucket 0 but not the others) and dies, so some of the survivors' calls may
// complete with its share in them and at least one fails on every survivor.
// "after" dies once every rank finished step t.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "dopt/actors/simulate.hpp"
#include "dopt/optim/averagers.hpp"
#include "dopt/optim/post_local_sgd.hpp"
#include "dopt/optim/reducer.hpp"
#include "dopt/optim/registry.hpp"

using namespace dopt;
using namespace dopt::optim;

namespace {

struct Killed : std::runtime_error {
  Killed() : std::runtime_error("killed by the test") {}
};

std::uint64_t mix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

double grad_elem(int r, std::int64_t t, std::size_t i, std::int64_t k) {
  const std::uint64_t h = mix64(mix64(mix64(mix64(static_cast<std::uint64_t>(r) + 1) + static_cast<std::uint64_t>(t)) +
                                      static_cast<std::uint64_t>(i)) +
                                static_cast<std::uint64_t>(k));
  return static_cast<double>(static_cast<std::int64_t>(h % 1024) - 512) / 256.0;
}

double init_elem(std::size_t i, std::int64_t k) {
  const std::uint64_t h = mix64(mix64(1000003ull + i) + static_cast<std::uint64_t>(k));
  return static_cast<double>(h >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

const std::vector<std::int64_t> kSizes = {257, 64, 3000, 33, 5, 300, 1, 7001, 12};

/// Parameter 2 is float64 when `mixed` (post-local SGD: two all-reduces).
std::vector<Tensor> make_params(bool mixed) {
  std::vector<Tensor> ps;
  for (std::size_t i = 0; i < kSizes.size(); ++i) {
    const DType dt = mixed && i == 2 ? DType::float64 : DType::float32;
    Tensor p = Tensor::zeros({kSizes[i]}, dt);
    for (std::int64_t k = 0; k < kSizes[i]; ++k) {
      if (dt == DType::float64) p.data<double>()[k] = init_elem(i, k);
      else p.data<float>()[k] = static_cast<float>(init_elem(i, k));
    }
    p.set_requires_grad(true);
    ps.push_back(p);
  }
  return ps;
}

void set_grads(const std::vector<Tensor>& ps, int r, std::int64_t t) {
  for (std::size_t i = 0; i < ps.size(); ++i) {
    Tensor g = Tensor::zeros(ps[i].shape(), ps[i].dtype());
    for (std::int64_t k = 0; k < kSizes[i]; ++k) {
      if (g.dtype() == DType::float64) g.data<double>()[k] = grad_elem(r, t, i, k);
      else g.data<float>()[k] = static_cast<float>(grad_elem(r, t, i, k));
    }
    ps[i].set_grad(g);
  }
}

std::vector<std::vector<unsigned char>> bytes_of(const std::vector<Tensor>& ps) {
  std::vector<std::vector<unsigned char>> out;
  for (const auto& p : ps) {
    const auto* b = static_cast<const unsigned char*>(p.data_ptr());
    out.emplace_back(b, b + p.nbytes());
  }
  return out;
}

std::string ranks_str(const std::vector<int>& r) {
  std::string s;
  for (int x : r) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

struct Scenario {
  int n = 3;
  int victim = 1;
  std::int64_t step = 2;   // the step at which it is lost
  std::string point;       // "before", "during", "after"; "" for no loss
  std::int64_t steps = 6;
  bool callback = false;
  std::int64_t change_at = -1;  // C of the header
};

struct RankResult {
  bool done = false;
  std::vector<std::vector<unsigned char>> params;
  std::string log;
  int final_size = 0;
};

/// Runs fn over sc.n simulated ranks; a Killed rank is the scenario's loss.
void run_ranks(int n, const std::function<void(RankContext&)>& fn) {
  SimulateOptions so;
  so.timeout = std::chrono::seconds(30);
  try {
    simulate(n, fn, so);
  } catch (const Error& e) {
    if (std::string(e.what()).find("killed by the test") == std::string::npos) throw;
  }
}

std::vector<int> survivors(const Scenario& sc) {
  std::vector<int> s;
  for (int r = 0; r < sc.n; ++r)
    if (r != sc.victim || sc.point.empty()) s.push_back(r);
  return s;
}

/// What the lost rank leaves behind: the tensors of collectives it posted
/// and never waited for stay alive until the test ends.
struct Graveyard {
  std::mutex mu;
  std::vector<Tensor> tensors;
  std::vector<Future<void>> futures;
  void keep(std::vector<Tensor> ts, Future<void> f = {}) {
    std::lock_guard<std::mutex> lock(mu);
    for (auto& t : ts) tensors.push_back(std::move(t));
    if (f.valid()) futures.push_back(std::move(f));
  }
};

/// "after": the lost rank waits until every rank finished step t.
struct StepCounter {
  std::atomic<int> done{0};
  void arrive() { done.fetch_add(1); }
  void wait_all(int n) {
    while (done.load() < n) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
};

// --- post-local SGD ------------------------------------------------------------

constexpr std::int64_t kWarmup = 1, kPeriod = 2;  // averages at steps 1, 3, 5
bool averages(std::int64_t t) { return t >= kWarmup && (t - kWarmup) % kPeriod == 0; }

OptimizerSpec plsgd_inner() { return OptimizerSpec{"SGD", {{"lr", 0.05}, {"momentum", 0.9}}}; }

std::vector<RankResult> plsgd_run(const Scenario& sc) {
  std::vector<RankResult> res(static_cast<std::size_t>(sc.n));
  std::mutex mu;
  Graveyard grave;
  StepCounter after;
  run_ranks(sc.n, [&](RankContext& ctx) {
    const int me = ctx.rank();
    RankResult out;
    ProcessGroup world = ctx.world();
    auto params = make_params(true);
    PostLocalSGDOptimizer opt(make_optimizer(plsgd_inner(), {OptimizerParamGroup(params)}),
                              std::make_unique<PeriodicModelAverager>(kPeriod, kWarmup, world));
    if (sc.callback)
      opt.enable_survive([&](const ZeroRecovery& r) {
        world = r.group;
        out.log += "callback lost=" + ranks_str(r.lost) + " step=" + std::to_string(r.step) + ";";
      });
    else
      opt.enable_survive();
    const bool victim = me == sc.victim && !sc.point.empty();
    for (std::int64_t t = 0; t < sc.steps; ++t) {
      if (victim && t == sc.step && sc.point == "before") throw Killed();
      set_grads(params, me, t);
      if (victim && t == sc.step && sc.point == "during") {
        opt.optim().step();
        std::vector<Tensor> f32;
        for (const auto& p : params)
          if (p.dtype() == DType::float32) f32.push_back(p);
        auto f = average_parameters_async(f32, world);  // its float32 share; never the float64 one
        grave.keep(params, std::move(f));
        throw Killed();
      }
      try {
        opt.step();
      } catch (const MembershipChangedError& e) {
        world = e.recovery().group;
        out.log += "changed lost=" + ranks_str(e.recovery().lost) + " step=" + std::to_string(e.recovery().step) +
                   (e.recovery().step_completed ? " completed" : "") + ";";
      }
      if (!sc.point.empty() && t == sc.step) after.arrive();
      if (victim && t == sc.step && sc.point == "after") {
        after.wait_all(sc.n);
        grave.keep(params);
        throw Killed();
      }
    }
    out.done = true;
    out.final_size = world.size();
    out.params = bytes_of(params);
    std::lock_guard<std::mutex> lock(mu);
    res[static_cast<std::size_t>(me)] = std::move(out);
  });
  return res;
}

std::vector<RankResult> plsgd_reference(const Scenario& sc) {
  std::vector<RankResult> res(static_cast<std::size_t>(sc.n));
  std::mutex mu;
  const auto alive = survivors(sc);
  run_ranks(sc.n, [&](RankContext& ctx) {
    const int me = ctx.rank();
    RankResult out;
    ProcessGroup world = ctx.world();
    ProcessGroup group = world;
    auto params = make_params(true);
    std::vector<OptimizerParamGroup> gs{OptimizerParamGroup(params)};
    auto opt = make_optimizer(plsgd_inner(), std::move(gs));
    for (std::int64_t t = 0; t < sc.steps; ++t) {
      if (t == sc.change_at) {
        group = world.new_group(alive);  // every rank of the world
        if (me == sc.victim) return;
      }
      set_grads(params, me, t);
      opt->step();
      if (averages(t)) average_parameters(get_params_to_average(opt->param_groups()), group);
    }
    out.done = true;
    out.final_size = group.size();
    out.params = bytes_of(params);
    std::lock_guard<std::mutex> lock(mu);
    res[static_cast<std::size_t>(me)] = std::move(out);
  });
  return res;
}

std::int64_t plsgd_change_at(const Scenario& sc) {
  std::int64_t c = sc.point == "after" ? sc.step + 1 : sc.step;
  while (!averages(c)) ++c;
  return c;
}

// --- Reducer -------------------------------------------------------------------

OptimizerSpec ddp_inner() { return OptimizerSpec{"Adam", {{"lr", 0.01}}}; }

ReducerOptions small_buckets(bool survive) {
  ReducerOptions ro;
  ro.first_bucket_cap_bytes = 2048;
  ro.bucket_cap_bytes = 16384;
  ro.broadcast_parameters = false;  // the same initial parameters everywhere
  ro.survive = survive;
  return ro;
}

std::vector<RankResult> reducer_run(const Scenario& sc) {
  std::vector<RankResult> res(static_cast<std::size_t>(sc.n));
  std::mutex mu;
  Graveyard grave;
  StepCounter after;
  run_ranks(sc.n, [&](RankContext& ctx) {
    const int me = ctx.rank();
    RankResult out;
    ProcessGroup world = ctx.world();
    auto params = make_params(false);
    ReducerOptions ro = small_buckets(true);
    if (sc.callback)
      ro.on_membership_change = [&](const ZeroRecovery& r) {
        world = r.group;
        out.log += "callback lost=" + ranks_str(r.lost) + " step=" + std::to_string(r.step) + ";";
      };
    auto reducer = std::make_unique<Reducer>(params, world, ro);
    REQUIRE(reducer->num_buckets() >= 3);
    auto opt = make_optimizer(ddp_inner(), {OptimizerParamGroup(params)});
    const bool victim = me == sc.victim && !sc.point.empty();
    for (std::int64_t t = 0; t < sc.steps; ++t) {
      if (victim && t == sc.step && sc.point == "before") throw Killed();
      set_grads(params, me, t);
      if (victim && t == sc.step && sc.point == "during") {
        const auto buckets = reducer->bucket_indices();
        for (auto i : buckets[0]) reducer->mark_ready(params[i]);  // bucket 0 launches
        grave.keep(params);
        reducer.release();  // its buckets stay alive for the collective it posted
        throw Killed();
      }
      for (std::size_t i = params.size(); i-- > 0;) reducer->mark_ready(params[i]);  // as a backward pass
      try {
        reducer->finalize();
      } catch (const MembershipChangedError& e) {
        world = e.recovery().group;
        out.log += "changed lost=" + ranks_str(e.recovery().lost) + " step=" + std::to_string(e.recovery().step) +
                   (e.recovery().step_completed ? " completed" : "") + ";";
      }
      opt->step();
      if (!sc.point.empty() && t == sc.step) after.arrive();
      if (victim && t == sc.step && sc.point == "after") {
        after.wait_all(sc.n);
        throw Killed();
      }
    }
    out.done = true;
    out.final_size = world.size();
    out.params = bytes_of(params);
    std::lock_guard<std::mutex> lock(mu);
    res[static_cast<std::size_t>(me)] = std::move(out);
  });
  return res;
}

std::vector<RankResult> reducer_reference(const Scenario& sc) {
  std::vector<RankResult> res(static_cast<std::size_t>(sc.n));
  std::mutex mu;
  const auto alive = survivors(sc);
  run_ranks(sc.n, [&](RankContext& ctx) {
    const int me = ctx.rank();
    RankResult out;
    ProcessGroup world = ctx.world();
    ProcessGroup group = world;
    auto params = make_params(false);
    auto reducer = std::make_unique<Reducer>(params, world, small_buckets(false));
    auto opt = make_optimizer(ddp_inner(), {OptimizerParamGroup(params)});
    for (std::int64_t t = 0; t < sc.steps; ++t) {
      if (t == sc.change_at) {
        group = world.new_group(alive);  // every rank of the world
        if (me == sc.victim) return;
        reducer = std::make_unique<Reducer>(params, group, small_buckets(false));
      }
      set_grads(params, me, t);
      for (std::size_t i = params.size(); i-- > 0;) reducer->mark_ready(params[i]);
      reducer->finalize();
      opt->step();
    }
    out.done = true;
    out.final_size = group.size();
    out.params = bytes_of(params);
    std::lock_guard<std::mutex> lock(mu);
    res[static_cast<std::size_t>(me)] = std::move(out);
  });
  return res;
}

void check_bitwise(const Scenario& sc, const std::vector<RankResult>& got, const std::vector<RankResult>& ref) {
  const auto alive = survivors(sc);
  for (int r : alive) {
    const auto& x = got[static_cast<std::size_t>(r)];
    const auto& y = ref[static_cast<std::size_t>(r)];
    INFO("rank " << r << ": " << x.log);
    REQUIRE(x.done);
    REQUIRE(y.done);
    CHECK(x.final_size == static_cast<int>(alive.size()));
    REQUIRE(x.params.size() == y.params.size());
    for (std::size_t i = 0; i < y.params.size(); ++i) {
      INFO("parameter " << i);
      CHECK(x.params[i] == y.params[i]);
    }
    if (!sc.point.empty()) CHECK(x.log.find("lost=" + std::to_string(sc.victim)) != std::string::npos);
  }
}

}  // namespace

TEST_CASE("post_local_sgd survive: a rank lost before, during or after the averaging; bitwise the reference",
          "[post_local_sgd][survive]") {
  Scenario sc;
  sc.n = GENERATE(3, 5);
  sc.point = GENERATE(std::string("before"), std::string("during"), std::string("after"));
  sc.callback = GENERATE(false, true);
  sc.victim = sc.n == 3 ? 1 : 2;
  sc.step = 3;  // an averaging step
  sc.change_at = plsgd_change_at(sc);
  INFO(sc.n << " ranks, rank " << sc.victim << " lost " << sc.point << " step " << sc.step << ", change at step "
            << sc.change_at << (sc.callback ? ", callback" : ""));
  check_bitwise(sc, plsgd_run(sc), plsgd_reference(sc));
}

TEST_CASE("post_local_sgd survive: a rank lost between averages is noticed at the next one",
          "[post_local_sgd][survive]") {
  Scenario sc;
  sc.n = GENERATE(3, 5);
  sc.victim = 0;
  sc.point = "before";
  sc.step = 2;  // a local step: the survivors notice at step 3's average
  sc.change_at = plsgd_change_at(sc);
  REQUIRE(sc.change_at == 3);
  check_bitwise(sc, plsgd_run(sc), plsgd_reference(sc));
}

TEST_CASE("post_local_sgd survive: without a loss nothing changes; only the periodic averager survives",
          "[post_local_sgd][survive]") {
  Scenario sc;
  sc.n = 3;
  sc.point = "";
  check_bitwise(sc, plsgd_run(sc), plsgd_reference(sc));
  simulate(2, [](RankContext& ctx) {
    auto params = make_params(true);
    PostLocalSGDOptimizer opt(make_optimizer(plsgd_inner(), {OptimizerParamGroup(params)}),
                              std::make_unique<HierarchicalModelAverager>(std::map<std::int64_t, int>{{2, 2}}, 0,
                                                                          ctx.world()));
    CHECK_THROWS_AS(opt.enable_survive(), NotSupportedError);
    CHECK_THROWS_AS(opt.recover(), StateError);
  });
}

TEST_CASE("reducer survive: a rank lost before, during or after the bucket reduce; bitwise the reference",
          "[reducer][survive]") {
  Scenario sc;
  sc.n = GENERATE(3, 5);
  sc.point = GENERATE(std::string("before"), std::string("during"), std::string("after"));
  sc.callback = GENERATE(false, true);
  sc.victim = sc.n == 3 ? 2 : 1;
  sc.step = 2;
  sc.steps = 5;
  sc.change_at = sc.point == "after" ? sc.step + 1 : sc.step;
  INFO(sc.n << " ranks, rank " << sc.victim << " lost " << sc.point << " step " << sc.step
            << (sc.callback ? ", callback" : ""));
  check_bitwise(sc, reducer_run(sc), reducer_reference(sc));
}

TEST_CASE("reducer survive: without a loss bitwise the plain reducer; refusals", "[reducer][survive]") {
  Scenario sc;
  sc.n = 3;
  sc.point = "";
  sc.steps = 3;
  check_bitwise(sc, reducer_run(sc), reducer_reference(sc));
  simulate(2, [](RankContext& ctx) {
    auto params = make_params(false);
    Reducer plain(params, ctx.world(), small_buckets(false));
    CHECK_THROWS_AS(plain.recover(), StateError);
    Reducer r(params, ctx.world(), small_buckets(true));
    CHECK_THROWS_AS(r.register_comm_hook(allreduce_hook(ctx.world())), NotSupportedError);
  });
}
