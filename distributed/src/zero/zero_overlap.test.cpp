// ZeroRedundancyOptimizer with overlap_with_ddp over simulated ranks: bitwise
// equality with the non-overlapped ZeRO (same reducer, same gradients in),
// for every optimizer with a functional form, two parameter groups, a
// learning-rate change, world sizes 2, 3 and 5, both hooks; fewer buckets
// than ranks; the plan; uneven inputs under Join; the errors. Rank functions
// record what they found; the test thread asserts after simulate() returned.
#include <catch2/catch.hpp>

#include "rank_checks.hpp"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "dopt/actors/join.hpp"
#include "dopt/actors/simulate.hpp"
#include "dopt/distributed/comm_hooks.hpp"
#include "dopt/distributed/reducer.hpp"
#include "dopt/optim/registry.hpp"
#include "dopt/distributed/zero.hpp"
#include "dopt/distributed/zero_overlap.hpp"
#include "reference_data.hpp"
#include "sim_timeout.hpp"

using namespace dopt;
using namespace dopt::optim;

namespace {

SimulateOptions short_timeout() { return dopt::testing::with_timeout(std::chrono::seconds(30)); }

using Log = dopt::testing::RankLog;

struct Model {
  std::vector<Shape> shapes{{5}, {9}, {9}, {3}, {7}, {1}, {7}, {4, 3}, {}, {6}};
  std::vector<DType> dtypes;  // empty: float32
  std::vector<std::vector<std::size_t>> groups{{0, 1, 2, 3, 4}, {5, 6, 7, 8, 9}};
  DType dt(std::size_t i) const { return dtypes.empty() ? DType::float32 : dtypes[i]; }
  std::size_t n() const { return shapes.size(); }
};

std::vector<Tensor> make_params(const Model& m) {
  std::vector<Tensor> ps;
  for (std::size_t i = 0; i < m.n(); ++i) {
    auto v = dopt::testing::values<double>(static_cast<std::size_t>(shape_numel(m.shapes[i])), 7 + i);
    ps.push_back(Tensor::from_vector(v, m.shapes[i]).to(m.dt(i)));
  }
  return ps;
}

Tensor grad_value(const Model& m, int t, int r, std::size_t i) {
  auto v = dopt::testing::values<double>(static_cast<std::size_t>(shape_numel(m.shapes[i])),
                                100000 + 1000 * static_cast<std::uint64_t>(t) + 37 * static_cast<std::uint64_t>(r) + i,
                                2.0);
  return Tensor::from_vector(v, m.shapes[i]).to(m.dt(i));
}

std::vector<OptimizerParamGroup> make_groups(const Model& m, const std::vector<Tensor>& ps, const OptimizerSpec& spec,
                                             const Hyperparams& group1) {
  std::vector<OptimizerParamGroup> out;
  for (std::size_t g = 0; g < m.groups.size(); ++g) {
    std::vector<Tensor> gp;
    for (auto i : m.groups[g]) gp.push_back(ps[i]);
    Hyperparams h = spec.hyperparameters;
    if (g == 1)
      for (const auto& [k, v] : group1) h[k] = v;
    out.emplace_back(std::move(gp), make_options(OptimizerSpec{spec.name, h}));
  }
  return out;
}

struct OptCase {
  OptimizerSpec spec;
  Hyperparams group1;  // overrides of group 1
};

std::vector<OptCase> all_optimizers() {
  return {
      {{"SGD", {{"lr", 0.1}, {"momentum", 0.9}, {"weight_decay", 0.01}}}, {{"lr", 0.02}, {"nesterov", true}}},
      {{"Adam", {{"lr", 0.01}, {"weight_decay", 0.1}}}, {{"lr", 0.05}, {"amsgrad", true}}},
      {{"AdamW", {{"lr", 0.01}}}, {{"lr", 0.03}, {"weight_decay", 0.2}}},
      {{"Adagrad", {{"lr", 0.1}, {"lr_decay", 0.01}}}, {{"lr", 0.2}, {"initial_accumulator_value", 0.1}}},
      {{"RMSprop", {{"lr", 0.01}, {"momentum", 0.5}}}, {{"lr", 0.02}, {"centered", true}}},
      {{"Adamax", {{"lr", 0.02}}}, {{"lr", 0.01}, {"weight_decay", 0.05}}},
      {{"Adadelta", {{"lr", 1.0}}}, {{"lr", 0.5}, {"rho", 0.8}}},
      {{"Rprop", {{"lr", 0.01}}}, {{"lr", 0.02}, {"etas", std::vector<double>{0.4, 1.3}}}},
      {{"NAdam", {{"lr", 0.01}}}, {{"lr", 0.02}, {"weight_decay", 0.05}}},
      {{"RAdam", {{"lr", 0.01}, {"weight_decay", 0.1}}}, {{"lr", 0.03}}},
  };
}

std::string state_mismatch(const StateDict& a, const StateDict& b) {
  if (a.param_groups.size() != b.param_groups.size()) return "group count";
  for (std::size_t g = 0; g < a.param_groups.size(); ++g) {
    if (a.param_groups[g].params != b.param_groups[g].params) return "group " + std::to_string(g) + " ids";
    if (a.param_groups[g].hyperparams != b.param_groups[g].hyperparams)
      return "group " + std::to_string(g) + " hyperparameters";
  }
  if (a.state.size() != b.state.size()) return "state size " + std::to_string(a.state.size()) + " vs " +
                                                std::to_string(b.state.size());
  for (const auto& [id, st] : a.state) {
    auto it = b.state.find(id);
    if (it == b.state.end()) return "state of " + std::to_string(id) + " missing";
    if (st.size() != it->second.size()) return "state keys of " + std::to_string(id);
    for (const auto& [k, t] : st) {
      auto jt = it->second.find(k);
      if (jt == it->second.end()) return "state " + k + " of " + std::to_string(id) + " missing";
      if (t.defined() != jt->second.defined() || (t.defined() && !t.equal(jt->second)))
        return "state " + k + " of " + std::to_string(id) + " differs";
    }
  }
  return "";
}

struct EqualityRun {
  Model model;
  OptCase opt;
  int world = 2;
  bool interleaved = true;
  bool fp16 = false;
  std::size_t first_cap = 24;   // bytes: several buckets by default
  std::size_t cap = 64;
  int iters = 4;
};

/// Overlapped ZeRO (A) and non-overlapped ZeRO (B), each behind its own
/// reducer with the same layout, fed the same gradients; every iteration
/// compares parameters and grads bitwise on every rank, at the end the
/// consolidated state dicts on rank 0.
void run_equality(const EqualityRun& c, Log& log, std::vector<int>* owners_out = nullptr) {
  std::mutex owners_mutex;
  simulate(
      c.world,
      [&](RankContext& ctx) {
        const int r = ctx.rank();
        const std::string where = c.opt.spec.name + " W=" + std::to_string(c.world) + " rank " + std::to_string(r);
        auto pa = make_params(c.model);
        auto pb = make_params(c.model);
        ZeroRedundancyOptimizer za(make_groups(c.model, pa, c.opt.spec, c.opt.group1), c.opt.spec,
                                   ZeroOptions{ctx.world(), false, true});
        ZeroRedundancyOptimizer zb(make_groups(c.model, pb, c.opt.spec, c.opt.group1), c.opt.spec,
                                   ZeroOptions{ctx.world()});
        const auto ropts = ReducerOptions{.bucket_cap_bytes = c.cap, .first_bucket_cap_bytes = c.first_cap};
        Reducer ra(pa, ctx.world(), ropts);
        Reducer rb(pb, ctx.world(), ropts);
        CommHook inner = c.fp16 ? fp16_compress_hook(ctx.world()) : allreduce_hook(ctx.world());
        ra.register_comm_hook(c.interleaved ? hook_with_zero_step_interleaved(inner, ra, za)
                                            : hook_with_zero_step(inner, ra, za));
        if (c.fp16) rb.register_comm_hook(fp16_compress_hook(ctx.world()));
        if (owners_out && r == 0) {
          std::lock_guard<std::mutex> lock(owners_mutex);
          *owners_out = za.overlap_bucket_owners();
        }
        for (int t = 0; t < c.iters; ++t) {
          if (t == 2)  // a learning-rate change between iterations takes effect
            for (auto* z : {&za, &zb}) {
              auto& o = *z->param_groups()[0].options;
              o.set_lr(o.get_lr() * 0.5);
            }
          for (std::size_t k = c.model.n(); k-- > 0;) {
            const Tensor g = grad_value(c.model, t, r, k);
            pa[k].set_grad(g.clone());
            ra.mark_ready(pa[k]);
          }
          ra.finalize();
          za.step();
          for (std::size_t k = c.model.n(); k-- > 0;) {
            pb[k].set_grad(grad_value(c.model, t, r, k));
            rb.mark_ready(pb[k]);
          }
          rb.finalize();
          zb.step();
          for (std::size_t k = 0; k < c.model.n(); ++k) {
            log.check(pa[k].equal(pb[k]), where + " iteration " + std::to_string(t) + ": parameter " +
                                              std::to_string(k) + " differs");
            log.check(pa[k].grad().equal(pb[k].grad()), where + " iteration " + std::to_string(t) + ": grad " +
                                                            std::to_string(k) + " differs");
          }
          log.check(za.step_count() == t + 1, where + ": step_count");
        }
        const auto init = make_params(c.model);
        for (std::size_t k = 0; k < c.model.n(); ++k)
          log.check(!pa[k].equal(init[k]), where + ": parameter " + std::to_string(k) + " never changed");
        za.consolidate_state_dict(0);
        zb.consolidate_state_dict(0);
        if (r == 0) {
          const std::string m = state_mismatch(za.state_dict(), zb.state_dict());
          log.check(m.empty(), where + ": consolidated state dicts: " + m);
        }
        // The local state dicts cover what each rank owns (the plan's partition).
        std::size_t owned = 0;
        for (const auto& g : za.partition()[static_cast<std::size_t>(r)]) owned += g.size();
        std::size_t local = 0;
        for (const auto& g : za.optim().param_groups()) local += g.params.size();
        log.check(owned == local, where + ": local optimizer holds the plan's partition");
      },
      short_timeout());
}

void require_clean(Log& log, long min_checks) {
  log.report();
  CHECK(log.checks() >= min_checks);
}

}  // namespace

TEST_CASE("ZeRO overlap equals ZeRO without overlap, bitwise: every optimizer, two groups, lr change, W 2/3/5",
          "[zero][overlap]") {
  const int world = GENERATE(2, 3, 5);
  const bool interleaved = GENERATE(true, false);
  for (const auto& opt : all_optimizers()) {
    INFO(opt.spec.name << " W=" << world << (interleaved ? " interleaved" : " after backward"));
    Log log;
    EqualityRun c;
    c.opt = opt;
    c.world = world;
    c.interleaved = interleaved;
    std::vector<int> owners;
    run_equality(c, log, &owners);
    require_clean(log, 4L * 10 * 2 * world);
    CHECK(owners.size() >= 4);  // several buckets
  }
}

TEST_CASE("ZeRO overlap: float64 and float32 buckets, and the fp16 compression hook inside", "[zero][overlap]") {
  const int world = GENERATE(2, 3);
  for (const char* name : {"Adam", "SGD"}) {
    INFO(name << " W=" << world);
    auto opts = all_optimizers();
    auto it = std::find_if(opts.begin(), opts.end(), [&](const OptCase& o) { return o.spec.name == name; });
    {
      Log log;
      EqualityRun c;
      c.opt = *it;
      c.world = world;
      c.model.dtypes = {DType::float64, DType::float32, DType::float64, DType::float32, DType::float32,
                        DType::float64, DType::float32, DType::float32, DType::float64, DType::float32};
      run_equality(c, log);
      require_clean(log, 4L * 10 * 2 * world);
    }
    {
      Log log;
      EqualityRun c;
      c.opt = *it;
      c.world = world;
      c.fp16 = true;
      run_equality(c, log);
      require_clean(log, 4L * 10 * 2 * world);
    }
  }
}

TEST_CASE("ZeRO overlap: fewer buckets than ranks (the others own nothing), still equal", "[zero][overlap]") {
  const int world = GENERATE(3, 5);
  for (std::size_t first_cap : {std::size_t{1} << 20, std::size_t{40}}) {
    INFO("W=" << world << " first cap " << first_cap);
    Log log;
    EqualityRun c;
    c.opt = all_optimizers()[1];  // Adam
    c.world = world;
    c.first_cap = first_cap;
    c.cap = 1u << 20;
    std::vector<int> owners;
    run_equality(c, log, &owners);
    require_clean(log, 4L * 10 * 2 * world);
    if (first_cap > 1000) {
      REQUIRE(owners.size() == 1);
      CHECK(owners[0] == 0);
    } else {
      // Registration order: {0, 1} (56 bytes) closes the first bucket, {2..9}
      // (184 bytes) is the other; reversed: bucket 0 = {2..9} -> rank 0, bucket 1 -> rank 1.
      REQUIRE(owners.size() == 2);
      CHECK(owners[0] == 0);
      CHECK(owners[1] == 1);
    }
  }
}

TEST_CASE("ZeRO overlap plan: whole buckets balanced by bytes, largest first, ties to the lowest rank",
          "[zero][overlap]") {
  // One parameter per bucket (caps of 1 byte), so the bucket sizes are the parameters'.
  Model m;
  m.shapes = {{10}, {10}, {40}, {20}, {30}, {10}};
  m.groups = {{0, 1, 2}, {3, 4, 5}};
  std::vector<std::vector<int>> got(3);
  std::vector<std::vector<std::vector<std::size_t>>> layout(3);
  simulate(
      3,
      [&](RankContext& ctx) {
        auto ps = make_params(m);
        ZeroRedundancyOptimizer z(make_groups(m, ps, OptimizerSpec{"SGD", {{"lr", 0.1}}}, {}),
                                  OptimizerSpec{"SGD", {{"lr", 0.1}}}, ZeroOptions{ctx.world(), false, true});
        Reducer red(ps, ctx.world(), ReducerOptions{.bucket_cap_bytes = 1, .first_bucket_cap_bytes = 1});  // one param per bucket
        red.register_comm_hook(hook_with_zero_step_interleaved(allreduce_hook(ctx.world()), red, z));
        got[static_cast<std::size_t>(ctx.rank())] = z.overlap_bucket_owners();
        layout[static_cast<std::size_t>(ctx.rank())] = red.bucket_indices();
      },
      short_timeout());
  // Buckets (reversed): params 5,4,3,2,1,0 with 10,30,20,40,10,10 elements.
  REQUIRE(layout[0] == std::vector<std::vector<std::size_t>>{{5}, {4}, {3}, {2}, {1}, {0}});
  // By size: 40 (b3) -> r0; 30 (b1) -> r1; 20 (b2) -> r2; then the 10s in bucket order:
  // b0 -> r2 (loads 40, 30, 20), b4 -> r1 (40, 30, 30: the lowest of the tied), b5 -> r2 (40, 40, 30).
  const std::vector<int> expect{2, 1, 2, 0, 1, 2};
  for (int r = 0; r < 3; ++r) CHECK(got[static_cast<std::size_t>(r)] == expect);
}

TEST_CASE("ZeRO overlap under Join: a joined rank keeps stepping and broadcasting the buckets it owns",
          "[zero][overlap][join]") {
  const int world = GENERATE(2, 3, 5);
  const bool zero_first = GENERATE(false, true);
  INFO("W=" << world << (zero_first ? " ZeRO first in the Join" : " reducer first in the Join"));
  Model m;
  const OptCase opt = all_optimizers()[1];  // Adam
  auto batches = [](int r) { return r == 1 ? 2 : 5; };
  const auto ropts = ReducerOptions{.bucket_cap_bytes = 64, .first_bucket_cap_bytes = 24};
  // Reference: reducer + a plain local optimizer over all parameters under Join.
  std::vector<std::vector<Tensor>> ref(static_cast<std::size_t>(world));
  simulate(
      world,
      [&](RankContext& ctx) {
        const int r = ctx.rank();
        auto ps = make_params(m);
        auto opt_local = make_optimizer(opt.spec, make_groups(m, ps, opt.spec, opt.group1));
        Reducer red(ps, ctx.world(), ropts);
        Join join({&red});
        for (int t = 0; t < batches(r); ++t) {
          for (std::size_t k = m.n(); k-- > 0;) {
            ps[k].set_grad(grad_value(m, t, r, k));
            red.mark_ready(ps[k]);
          }
          red.finalize();
          opt_local->step();
        }
        join.finish();
        for (auto& p : ps) ref[static_cast<std::size_t>(r)].push_back(p.clone());
      },
      short_timeout());
  std::vector<std::vector<Tensor>> got(static_cast<std::size_t>(world));
  std::vector<int> owners;
  std::vector<std::int64_t> steps(static_cast<std::size_t>(world));
  simulate(
      world,
      [&](RankContext& ctx) {
        const int r = ctx.rank();
        auto ps = make_params(m);
        ZeroRedundancyOptimizer z(make_groups(m, ps, opt.spec, opt.group1), opt.spec,
                                  ZeroOptions{ctx.world(), false, true});
        Reducer red(ps, ctx.world(), ropts);
        red.register_comm_hook(hook_with_zero_step_interleaved(allreduce_hook(ctx.world()), red, z));
        if (r == 0) owners = z.overlap_bucket_owners();
        std::vector<Joinable*> js{&red, &z};
        if (zero_first) std::swap(js[0], js[1]);
        Join join(js);
        for (int t = 0; t < batches(r); ++t) {
          for (std::size_t k = m.n(); k-- > 0;) {
            ps[k].set_grad(grad_value(m, t, r, k));
            red.mark_ready(ps[k]);
          }
          red.finalize();
          z.step();
        }
        join.finish();
        for (auto& p : ps) got[static_cast<std::size_t>(r)].push_back(p.clone());
        steps[static_cast<std::size_t>(r)] = z.step_count();
      },
      short_timeout());
  // Rank 1 (joined after 2 batches) owns some bucket.
  CHECK(std::count(owners.begin(), owners.end(), 1) > 0);
  for (int r = 0; r < world; ++r) {
    INFO("rank " << r);
    CHECK(steps[static_cast<std::size_t>(r)] == 5);  // shadowed iterations included
    for (std::size_t k = 0; k < m.n(); ++k) {
      INFO("parameter " << k);
      // Every rank, the joined one included, ends where rank 0's plain optimizer does.
      CHECK(got[static_cast<std::size_t>(r)][k].equal(ref[0][k]));
    }
  }
}

TEST_CASE("ZeRO overlap: errors and the contract's checks", "[zero][overlap]") {
  Log log;
  simulate(
      2,
      [&](RankContext& ctx) {
        Model m;
        auto ps = make_params(m);
        const OptimizerSpec spec{"SGD", {{"lr", 0.1}}};
        ZeroRedundancyOptimizer z(ps, spec, ZeroOptions{ctx.world(), false, true});
        log.check(z.overlap_with_ddp(), "overlap_with_ddp()");
        auto throws = [&](auto&& f, auto tag, const std::string& what) {
          using E = decltype(tag);
          bool ok = false;
          try {
            f();
          } catch (const E&) {
            ok = true;
          } catch (...) {
          }
          log.check(ok, what);
        };
        // Before the plan: no partition yet.
        throws([&] { z.consolidate_state_dict(0); }, StateError("", ""), "consolidate before the plan");
        throws([&] { (void)z.state_dict(); }, StateError("", ""), "state_dict before the plan");
        throws([&] { z.add_param_group(OptimizerParamGroup({Tensor::zeros({2})})); }, NotSupportedError("", ""),
               "add_param_group");
        // A hook on a ZeRO without overlap.
        {
          auto qs = make_params(m);
          ZeroRedundancyOptimizer plain(qs, spec, ZeroOptions{ctx.world()});
          Reducer rq(qs, ctx.world());
          throws([&] { (void)hook_with_zero_step(allreduce_hook(ctx.world()), rq, plain); }, ValueError("", ""),
                 "hook on a ZeRO without overlap");
        }
        // A reducer over other parameters (local check, before any collective).
        {
          std::vector<Tensor> part(ps.begin(), ps.begin() + 3);
          Reducer rp(part, ctx.world(), ReducerOptions{.broadcast_parameters = false});
          throws([&] { (void)hook_with_zero_step(allreduce_hook(ctx.world()), rp, z); }, ValueError("", ""),
                 "reducer missing ZeRO parameters");
        }
        Reducer red(ps, ctx.world(), ReducerOptions{.bucket_cap_bytes = 64, .first_bucket_cap_bytes = 24});
        red.register_comm_hook(hook_with_zero_step(allreduce_hook(ctx.world()), red, z));
        throws([&] { z.step([] { return 1.0; }); }, ValueError("", ""), "closure");
        // Mid-iteration: step() and the state functions refuse.
        for (std::size_t k = m.n(); k-- > 0;) {
          ps[k].set_grad(grad_value(m, 0, ctx.rank(), k));
          red.mark_ready(ps[k]);
          if (k == 1) {
            log.check(red.num_launched() > 0 && red.num_launched() < red.num_buckets(), "partly launched");
            throws([&] { z.step(); }, StateError("", ""), "step() before finalize()");
            throws([&] { z.consolidate_state_dict(0); }, StateError("", ""), "consolidate mid-iteration");
          }
        }
        red.finalize();
        z.step();  // nothing left: returns
        log.check(z.step_count() == 1, "one iteration counted");
        z.consolidate_state_dict(1);
        if (ctx.rank() == 1) log.check(z.state_dict().param_groups.size() == 1, "state_dict after the plan");
      },
      short_timeout());
  require_clean(log, 12);
}

TEST_CASE("ZeRO overlap: state dicts and sharded checkpoints cross between overlap and none, at other world sizes",
          "[zero][overlap]") {
  Model m;
  const OptCase opt = all_optimizers()[1];  // Adam
  const auto ropts = ReducerOptions{.bucket_cap_bytes = 64, .first_bucket_cap_bytes = 24};
  char tmpl[] = "/tmp/dopt-zero-overlap-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  // Saved by an overlapped ZeRO at 3 ranks after 3 iterations.
  StateDict saved;
  simulate(
      3,
      [&](RankContext& ctx) {
        auto ps = make_params(m);
        ZeroRedundancyOptimizer z(make_groups(m, ps, opt.spec, opt.group1), opt.spec,
                                  ZeroOptions{ctx.world(), false, true});
        Reducer red(ps, ctx.world(), ropts);
        red.register_comm_hook(hook_with_zero_step(allreduce_hook(ctx.world()), red, z));
        for (int t = 0; t < 3; ++t) {
          for (std::size_t k = m.n(); k-- > 0;) {
            ps[k].set_grad(grad_value(m, t, ctx.rank(), k));
            red.mark_ready(ps[k]);
          }
          red.finalize();
        }
        z.save_sharded(dir);
        z.consolidate_state_dict(0);
        if (ctx.rank() == 0) saved = z.state_dict();
      },
      short_timeout());
  REQUIRE(saved.state.size() == m.n());
  // Loaded at 2 ranks without overlap, at 5 ranks with overlap (sharded), and
  // through load_state_dict at 2 ranks with overlap: the same global state.
  struct Load {
    int world;
    bool overlap;
    bool sharded;
  };
  for (const Load& l : {Load{2, false, true}, Load{5, true, true}, Load{2, true, false}}) {
    INFO("W=" << l.world << (l.overlap ? " overlap" : "") << (l.sharded ? " load_sharded" : " load_state_dict"));
    StateDict got;
    std::int64_t steps = -1;
    simulate(
        l.world,
        [&](RankContext& ctx) {
          auto ps = make_params(m);
          ZeroRedundancyOptimizer z(make_groups(m, ps, opt.spec, opt.group1), opt.spec,
                                    ZeroOptions{ctx.world(), false, l.overlap});
          Reducer red(ps, ctx.world(), ropts);
          if (l.overlap) red.register_comm_hook(hook_with_zero_step(allreduce_hook(ctx.world()), red, z));
          if (l.sharded) z.load_sharded(dir);
          else z.load_state_dict(saved);
          z.consolidate_state_dict(0);
          if (ctx.rank() == 0) {
            got = z.state_dict();
            steps = z.step_count();
          }
        },
        short_timeout());
    CHECK(state_mismatch(got, saved).empty());
    if (l.sharded) CHECK(steps == 3);
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}
