// FullyShard (dopt/libtorch/fully_shard.hpp): a torch::nn::Sequential of
// three Linear layers (tanh between) trained with stage 3 over simulated
// ranks equals the same model trained with stage 1 (ZeroRedundancyOptimizer
// over a ParameterBinding, gradients averaged by dopt's Reducer) bit for bit
// after every step, for Adam and SGD with momentum at 2 and 3 ranks and
// both backward_prefetch choices; between iterations the parameters hold no
// memory; the backward holds three unit buffers with before_backward and
// two with after_gradients (the gradients in the gathered memory) at 3 and 5
// ranks; a checkpoint (state dict and
// full parameters) carries a run over into a model whose forward calls each
// unit by hand (forward(unit, fn)); the caller's errors name the call
// and the rank; ranks that pass different backward_prefetch values all
// throw ValueError at construction (2, 3 and 5 ranks). The first comparison runs again between processes under
// dopt-run (CTest), one rank per process. Rank functions only record; the test thread asserts after
// simulate() returned.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include <torch/torch.h>
// glog (through c10) defines CHECK; the tests use Catch's.
#undef CHECK
#include <catch2/catch.hpp>

#include "dopt/actors/distributed.hpp"
#include "dopt/actors/simulate.hpp"
#include "dopt/distributed/reducer.hpp"
#include "dopt/distributed/zero.hpp"
#include "dopt/libtorch/fully_shard.hpp"
#include "dopt/libtorch/interop.hpp"

using namespace dopt;

namespace {

std::mutex seed_mutex;  // torch's default generator, one rank at a time

torch::nn::Sequential make_net(int seed = 0) {
  std::lock_guard<std::mutex> lock(seed_mutex);
  torch::manual_seed(seed);
  return torch::nn::Sequential(torch::nn::Linear(6, 5), torch::nn::Tanh(), torch::nn::Linear(5, 4), torch::nn::Tanh(),
                               torch::nn::Linear(4, 3));
}

/// Each rank's batch of a step (different per rank: the average matters).
at::Tensor batch(int rank, int step) {
  auto gen = at::detail::createCPUGenerator(1000 + 10 * step + rank);
  return torch::randn({8, 6}, gen);
}

/// The units of make_net(): its three Linear layers.
std::vector<std::shared_ptr<torch::nn::Module>> linear_units(const torch::nn::Sequential& net) {
  return {net->ptr(0), net->ptr(2), net->ptr(4)};
}

/// Stage 1 over the torch parameters: the reference.
struct Stage1 {
  Stage1(const ProcessGroup& world, const optim::OptimizerSpec& spec)
      : net(make_net()), bind(net->parameters()), zero(bind.params(), spec, optim::ZeroOptions{world}),
        reducer(bind.params(), world) {}
  void iteration(int rank, int step) {
    net->zero_grad(true);
    net->forward(batch(rank, step)).square().sum().backward();
    bind.sync();
    const auto& ps = bind.params();
    for (std::size_t i = ps.size(); i-- > 0;) reducer.mark_ready(ps[i]);
    reducer.finalize();  // every gradient: divided by N, all_reduced
    zero.step();
  }
  torch::nn::Sequential net;
  libtorch::ParameterBinding bind;
  optim::ZeroRedundancyOptimizer zero;
  optim::Reducer reducer;
};

std::string bytes_of(const Tensor& t) {
  return std::string(static_cast<const char*>(t.data_ptr()), static_cast<std::size_t>(t.nbytes()));
}

/// A state dict as "index.key bytes" lines.
std::vector<std::string> state_bytes(const StateDict& sd) {
  std::vector<std::string> out;
  for (const auto& [idx, st] : sd.state)
    for (const auto& [key, t] : st) out.push_back(std::to_string(idx) + "." + key + " " + bytes_of(t));
  return out;
}

/// What the ranks found wrong; asserted by the test thread.
struct Problems {
  std::mutex m;
  std::vector<std::string> list;
  void add(int rank, const std::string& what) {
    std::lock_guard<std::mutex> lock(m);
    list.push_back("rank " + std::to_string(rank) + ": " + what);
  }
};

/// Problems with the parameters between iterations: any that holds memory
/// or a gradient, or a gathered unit.
std::string between_iterations(libtorch::FullyShard& fs) {
  for (const auto& p : fs.parameters())
    if (p.numel() != 0 || p.storage().nbytes() != 0 || p.grad().defined()) return "a parameter holds memory";
  if (fs.gathered_bytes() != 0) return "gathered bytes " + std::to_string(fs.gathered_bytes());
  return "";
}

/// Under a launcher (dopt-run) each process runs its rank; alone, `world`
/// simulated ranks.
void run_launched(int world, const std::function<void(RankContext&)>& fn) {
  RunOptions o;
  o.simulated_ranks = world;
  run_distributed(fn, o);
}

/// What one comparison of stage 3 with stage 1 found (on every rank of the run).
struct Outcome {
  Problems problems;
  std::vector<std::string> state1, state3;
  bool had_rank0 = false;
};

/// One rank's run: stage 3 and stage 1 side by side, each step's parameters compared.
void stage3_rank(RankContext& ctx, const optim::OptimizerSpec& spec, libtorch::BackwardPrefetch prefetch,
                 Outcome& out) {
  constexpr int steps = 4;
  Problems& problems = out.problems;
  const int r = ctx.rank();
  Stage1 ref(ctx.world(), spec);
  auto net = make_net();
  libtorch::FullyShardOptions options = optim::ShardedUnitsOptions{ctx.world()};
  options.backward_prefetch = prefetch;
  dopt::libtorch::FullyShard fs(linear_units(net), spec, options);
  for (int step = 0; step < steps; ++step) {
    auto loss = fs.forward(net, batch(ctx.rank(), step)).square().sum();  // gathers, prefetches, frees each unit
    loss.backward();  // re-gathers each unit before its backward, reduces its gradients, frees it
    fs.step();        // this rank's shards
    ref.iteration(r, step);
    const std::string held = between_iterations(fs);
    if (!held.empty()) problems.add(r, "step " + std::to_string(step) + ": " + held);
    const auto full = fs.full_parameters();
    const auto& expected = ref.bind.torch_params();
    if (full.size() != expected.size()) problems.add(r, "parameter count " + std::to_string(full.size()));
    for (std::size_t i = 0; i < full.size() && i < expected.size(); ++i)
      if (!torch::equal(full[i], expected[i]))
        problems.add(r, "step " + std::to_string(step) + ": parameter " + std::to_string(i) + " differs from stage 1");
  }
  const StateDict sd3 = fs.state_dict();
  ref.zero.consolidate_state_dict(0);
  if (r == 0) {
    std::lock_guard<std::mutex> lock(problems.m);
    out.had_rank0 = true;
    out.state3 = state_bytes(sd3);
    out.state1 = state_bytes(ref.zero.state_dict());
  }
}

void check(const Outcome& out) {
  for (const auto& p : out.problems.list) FAIL_CHECK(p);
  if (!out.had_rank0) return;  // a launched process of another rank: its parameters were checked above
  CHECK(!out.state3.empty());
  CHECK(out.state3 == out.state1);
}

const char* name(libtorch::BackwardPrefetch p) {
  return p == libtorch::BackwardPrefetch::before_backward ? "before_backward" : "after_gradients";
}

void stage3_equals_stage1(int world, const optim::OptimizerSpec& spec) {
  for (auto prefetch : {libtorch::BackwardPrefetch::before_backward, libtorch::BackwardPrefetch::after_gradients}) {
    INFO("backward_prefetch " << name(prefetch));
    Outcome out;
    simulate(world, [&](RankContext& ctx) { stage3_rank(ctx, spec, prefetch, out); });
    check(out);
  }
}

/// Runs `body` on every rank of a simulated world of `world` (a 20 s group
/// timeout, so a rank left waiting fails) and returns each rank's outcome:
/// "no error", "ValueError: <what>" or "another error: <what>".
std::vector<std::string> outcomes(int world, const std::function<void(RankContext&)>& body) {
  std::mutex m;
  std::vector<std::string> out(static_cast<std::size_t>(world));
  simulate(world, [&](RankContext& ctx) {
    ctx.world().set_timeout(std::chrono::seconds(20));
    std::string what = "no error";
    try {
      body(ctx);
    } catch (const ValueError& e) {
      what = std::string("ValueError: ") + e.what();
    } catch (const std::exception& e) {
      what = std::string("another error: ") + e.what();
    }
    std::lock_guard<std::mutex> lock(m);
    out[static_cast<std::size_t>(ctx.rank())] = what;
  });
  return out;
}

}  // namespace

TEST_CASE("libtorch FullyShard: a Sequential of 3 Linear trained with stage 3 equals stage 1 bit for bit (Adam)",
          "[libtorch][fully_shard]") {
  for (int world : {2, 3})
    DYNAMIC_SECTION("world " << world) { stage3_equals_stage1(world, {"Adam", {{"lr", 0.01}}}); }
}

// Run by CTest under dopt-run (libtorch/CMakeLists.txt): one rank per
// process, the ranks' collectives between processes.
TEST_CASE("libtorch FullyShard between processes: stage 3 equals stage 1 bit for bit (Adam, SGD with momentum)",
          "[.processes][libtorch][fully_shard]") {
  // Both optimizers in one launched world: a second world right after the
  // first could reach rank 0's rendezvous port while rank 0 still closes the
  // first, and be turned away as a latecomer.
  Outcome adam, sgd;
  run_launched(2, [&](RankContext& ctx) {
    stage3_rank(ctx, {"Adam", {{"lr", 0.01}}}, libtorch::BackwardPrefetch::before_backward, adam);
    stage3_rank(ctx, {"SGD", {{"lr", 0.05}, {"momentum", 0.9}}}, libtorch::BackwardPrefetch::after_gradients, sgd);
  });
  check(adam);
  check(sgd);
}

TEST_CASE("libtorch FullyShard: stage 3 equals stage 1 bit for bit with SGD and momentum",
          "[libtorch][fully_shard]") {
  for (int world : {2, 3})
    DYNAMIC_SECTION("world " << world) { stage3_equals_stage1(world, {"SGD", {{"lr", 0.05}, {"momentum", 0.9}}}); }
}

TEST_CASE(
    "libtorch FullyShard: the backward holds three unit buffers prefetching before each unit's backward, two "
    "after its gradients (they take the gathered memory)",
    "[libtorch][fully_shard]") {
  // Four units of one size. Sampled when each unit's output gradient
  // arrives (the unit gathered again, the later unit's reduction in flight;
  // with before_backward the unit before's all_gather too) and inside each
  // unit's forward. The default is before_backward (torch FSDP's BACKWARD_PRE).
  using libtorch::BackwardPrefetch;
  for (int world : {3, 5})
    for (auto prefetch : {BackwardPrefetch::before_backward, BackwardPrefetch::after_gradients})
      DYNAMIC_SECTION("world " << world << ", backward_prefetch " << name(prefetch)) {
        const std::int64_t units_held = prefetch == BackwardPrefetch::before_backward ? 3 : 2;
        Problems problems;
        simulate(world, [&](RankContext& ctx) {
          torch::nn::Sequential net;
          {
            std::lock_guard<std::mutex> lock(seed_mutex);
            torch::manual_seed(3);
            net = torch::nn::Sequential(torch::nn::Linear(6, 6), torch::nn::Tanh(), torch::nn::Linear(6, 6),
                                        torch::nn::Tanh(), torch::nn::Linear(6, 6), torch::nn::Tanh(),
                                        torch::nn::Linear(6, 6));
          }
          libtorch::FullyShardOptions options = optim::ShardedUnitsOptions{ctx.world()};
          if (options.backward_prefetch != BackwardPrefetch::before_backward)
            problems.add(ctx.rank(), "the default backward_prefetch is not before_backward");
          options.backward_prefetch = prefetch;
          libtorch::FullyShard fs({net->ptr(0), net->ptr(2), net->ptr(4), net->ptr(6)},
                                  optim::OptimizerSpec{"Adam", {{"lr", 0.01}}}, options);
          if (fs.backward_prefetch() != prefetch) problems.add(ctx.rank(), "backward_prefetch() is not the option's");
          const std::int64_t unit_bytes = fs.sharded().shard_numel(0) * ctx.world_size() * 4;
          std::int64_t peak = 0;
          auto sample = [&] { peak = std::max(peak, fs.sharded().buffer_bytes()); };
          for (int step = 0; step < 3; ++step) {
            peak = 0;
            at::Tensor h = batch(ctx.rank(), step);
            for (std::size_t u = 0; u < 4; ++u) {
              auto layer = net->ptr<torch::nn::LinearImpl>(2 * u);
              h = fs.forward(u, [&] {
                sample();
                return layer->forward(h);
              });
              h.register_hook([&](const at::Tensor&) { sample(); });  // after FullyShard's own hook: gathered
              if (u < 3) h = h.tanh();
            }
            h.square().sum().backward();
            fs.step();
            const std::string where = "step " + std::to_string(step) + ": ";
            if (peak != units_held * unit_bytes)
              problems.add(ctx.rank(), where + "peak buffer_bytes " + std::to_string(peak) + ", " +
                                           std::to_string(units_held) + " units are " +
                                           std::to_string(units_held * unit_bytes));
            if (fs.sharded().buffer_bytes() != 0)
              problems.add(ctx.rank(), where + std::to_string(fs.sharded().buffer_bytes()) + " bytes after step()");
            const std::string held = between_iterations(fs);
            if (!held.empty()) problems.add(ctx.rank(), where + held);
          }
        });
        for (const auto& p : problems.list) FAIL_CHECK(p);
      }
}

TEST_CASE("libtorch FullyShard: state_dict and full_parameters carry a run over into another model, forward by unit",
          "[libtorch][fully_shard][checkpoint]") {
  Problems problems;
  simulate(2, [&](RankContext& ctx) {
    const optim::OptimizerSpec spec{"Adam", {{"lr", 0.01}}};
    auto net_a = make_net();
    auto net_b = make_net(7);  // other values: the checkpoint sets them
    libtorch::FullyShard a(linear_units(net_a), spec, optim::ShardedUnitsOptions{ctx.world()});
    libtorch::FullyShard b(linear_units(net_b), spec, optim::ShardedUnitsOptions{ctx.world()});
    auto iteration = [&](int step) {
      a.forward(net_a, batch(ctx.rank(), step)).square().sum().backward();
      a.step();
    };
    for (int step = 0; step < 2; ++step) iteration(step);
    b.load_full_parameters(a.full_parameters());
    b.load_state_dict(a.state_dict());
    // b's forward written out: each unit through forward(unit, fn), the tanh between them directly.
    auto first = net_b->ptr<torch::nn::LinearImpl>(0), second = net_b->ptr<torch::nn::LinearImpl>(2),
         third = net_b->ptr<torch::nn::LinearImpl>(4);
    for (int step = 2; step < 4; ++step) {
      iteration(step);
      const at::Tensor x = batch(ctx.rank(), step);
      at::Tensor h = b.forward(0, [&] { return first->forward(x); }).tanh();
      h = b.forward(1, [&] { return second->forward(h); }).tanh();
      b.forward(2, [&] { return third->forward(h); }).square().sum().backward();
      b.step();
    }
    const auto pa = a.full_parameters(), pb = b.full_parameters();
    for (std::size_t i = 0; i < pa.size(); ++i)
      if (!torch::equal(pa[i], pb[i])) problems.add(ctx.rank(), "parameter " + std::to_string(i) + " differs");
    if (state_bytes(a.state_dict()) != state_bytes(b.state_dict())) problems.add(ctx.rank(), "the states differ");
  });
  for (const auto& p : problems.list) FAIL_CHECK(p);
}

TEST_CASE("libtorch FullyShard: ranks that pass different backward_prefetch values all raise ValueError",
          "[libtorch][fully_shard]") {
  // One rank passes the other value. Every rank must raise at construction,
  // naming the call, its rank and each rank's value; none may go on into the
  // training (where, unchecked, the ranks would run with different
  // prefetch orders) or wait. The group's timeout is short so that a rank
  // left waiting fails the case instead of hanging it.
  using libtorch::BackwardPrefetch;
  struct Case {
    int world;
    int odd;  // the rank that passes the other value
    BackwardPrefetch most;
    std::vector<std::string> names;  // what each rank's error must contain besides the call and its rank
  };
  const std::vector<Case> cases{
      {2, 1, BackwardPrefetch::before_backward, {"rank 0 passes before_backward", "rank 1 passes after_gradients"}},
      {3, 0, BackwardPrefetch::after_gradients, {"rank 0 passes before_backward", "ranks 1-2 pass after_gradients"}},
      {5, 2, BackwardPrefetch::before_backward,
       {"ranks 0-1, 3-4 pass before_backward", "rank 2 passes after_gradients"}},
  };
  for (const Case& c : cases)
    DYNAMIC_SECTION("world " << c.world << ", rank " << c.odd << " passes the other value") {
      Outcome out;
      const std::vector<std::string> errors = outcomes(c.world, [&](RankContext& ctx) {
        const BackwardPrefetch other = c.most == BackwardPrefetch::before_backward ? BackwardPrefetch::after_gradients
                                                                                   : BackwardPrefetch::before_backward;
        stage3_rank(ctx, {"Adam", {{"lr", 0.01}}}, ctx.rank() == c.odd ? other : c.most, out);  // "no error": trained
      });
      for (const auto& p : out.problems.list) UNSCOPED_INFO("the unchecked training: " << p);
      for (int r = 0; r < c.world; ++r) {
        const std::string& e = errors[static_cast<std::size_t>(r)];
        INFO("rank " << r << ": " << e);
        CHECK(e.rfind("ValueError: FullyShard [rank " + std::to_string(r) + "]", 0) == 0);
        CHECK(e.find("backward_prefetch") != std::string::npos);
        for (const auto& part : c.names) CHECK(e.find(part) != std::string::npos);
        CHECK(e.find("the same") != std::string::npos);
      }
    }
  SECTION("world 3, rank 1 passes a value that is not a BackwardPrefetch") {
    const std::vector<std::string> errors = outcomes(3, [&](RankContext& ctx) {
      libtorch::FullyShardOptions options = optim::ShardedUnitsOptions{ctx.world()};
      if (ctx.rank() == 1) options.backward_prefetch = static_cast<BackwardPrefetch>(7);
      auto net = make_net();
      libtorch::FullyShard fs(linear_units(net), optim::OptimizerSpec{"Adam", {{"lr", 0.01}}}, options);
    });
    for (int r = 0; r < 3; ++r) {
      const std::string& e = errors[static_cast<std::size_t>(r)];
      INFO("rank " << r << ": " << e);
      CHECK(e.rfind("ValueError: FullyShard [rank " + std::to_string(r) + "]", 0) == 0);
      CHECK(e.find("ranks 0, 2 pass before_backward") != std::string::npos);
      CHECK(e.find("rank 1 passes 7 (not a BackwardPrefetch)") != std::string::npos);
    }
  }
}

TEST_CASE("libtorch FullyShard: the caller's errors name the call and the rank", "[libtorch][fully_shard]") {
  std::mutex m;
  std::vector<std::vector<std::string>> errors(2);  // each rank's, in the order of the calls
  simulate(2, [&](RankContext& ctx) {
    auto record = [&](const std::exception& e) {
      std::lock_guard<std::mutex> lock(m);
      errors[static_cast<std::size_t>(ctx.rank())].push_back(e.what());
    };
    const optim::OptimizerSpec spec{"Adam", {{"lr", 0.01}}};
    const optim::ShardedUnitsOptions options{ctx.world()};
    auto net = make_net();
    try {
      libtorch::FullyShard fs({}, spec, options);
    } catch (const ValueError& e) {
      record(e);
    }
    try {
      libtorch::FullyShard fs({net->ptr(0), net->ptr(1)}, spec, options);  // Tanh: no parameters
    } catch (const ValueError& e) {
      record(e);
    }
    try {
      libtorch::FullyShard fs({net->ptr(0), net->ptr(0)}, spec, options);
    } catch (const ValueError& e) {
      record(e);
    }
    try {
      libtorch::FullyShardOptions bad = options;
      bad.backward_prefetch = static_cast<libtorch::BackwardPrefetch>(7);
      libtorch::FullyShard fs(linear_units(net), spec, bad);
    } catch (const ValueError& e) {
      record(e);
    }
    try {
      torch::nn::Linear wide(3, 2);
      wide->to(torch::kDouble);
      libtorch::FullyShard fs({wide.ptr()}, spec, options);
    } catch (const TypeError& e) {
      record(e);
    }
    libtorch::FullyShard fs(linear_units(net), spec, options);
    auto expect = [&](auto&& call) {
      try {
        call();
      } catch (const Error& e) {
        record(e);
      }
    };
    const auto x = batch(ctx.rank(), 0);
    expect([&] { (void)fs.forward(3, [&] { return x; }); });  // no such unit
    expect([&] { fs.step(); });                                  // no backward yet
    const at::Tensor out = fs.forward(net, x);
    for (const auto& p : fs.parameters())  // autograd's saved views keep storage of size 0 until the backward
      if (p.numel() != 0 || p.storage().nbytes() != 0) record(std::runtime_error("after the forward: a full parameter"));
    out.square().sum().backward();
    expect([&] { fs.forward(net, x).square().sum().backward(); });  // a second backward before step()
    fs.step();  // the first backward's gradients
    expect([&] { fs.step(); });  // no backward since
    const std::string held = between_iterations(fs);
    if (!held.empty()) record(std::runtime_error("after the errors: " + held));
  });
  const std::vector<std::vector<std::string>> expected{
      {"FullyShard", "no units"},
      {"FullyShard", "unit 1", "has no trainable parameters"},
      {"FullyShard", "unit 1", "shares a parameter with unit 0"},
      {"FullyShard", "backward_prefetch 7", "before_backward or after_gradients"},
      {"FullyShard", "Double", "float32 CPU parameters only"},
      {"FullyShard.forward", "unit 3 is not one of the 3 units"},
      {"FullyShard.step", "no backward since the last step"},
      {"FullyShard.backward", "a second backward before step()"},
      {"FullyShard.step", "no backward since the last step"},
  };
  for (std::size_t r = 0; r < errors.size(); ++r) {
    INFO("rank " << r);
    REQUIRE(errors[r].size() == expected.size());
    for (std::size_t i = 0; i < expected.size(); ++i) {
      INFO(errors[r][i]);
      for (const auto& part : expected[i]) CHECK(errors[r][i].find(part) != std::string::npos);
      CHECK(errors[r][i].find("[rank " + std::to_string(r) + "]") != std::string::npos);
    }
  }
}
