// One rank of the real-process post-local SGD / model averaging / reducer
// tests (tests/plsgd_multiprocess.test.cpp). Started by dopt-run or by hand;
// joins the world with dopt::init_process_group and runs one scenario:
//
//   dopt_plsgd_peer periodic       PostLocalSGDOptimizer(SGD momentum / Adam) with
//                                  PeriodicModelAverager, schedules (period,
//                                  warmup) = (2, 3), (3, 0), (1, 2); a parameter
//                                  without a gradient at one step (not
//                                  averaged then); the optimizer's state dict
//                                  round trip (through a safetensors file) in
//                                  the middle of the run restores the
//                                  averager's step
//   dopt_plsgd_peer hierarchical   HierarchicalModelAverager {2: 2, 4: 4} and
//                                  {1: 1, 3: 2, 6: 4} on real subgroups (4 processes)
//   dopt_plsgd_peer reducer        Reducer with allreduce_hook, fp16/bf16
//                                  compression, post_localSGD_hook (subgroups,
//                                  and post_local_gradient_allreduce=false),
//                                  overlap on and off, several buckets; no_sync;
//                                  reducer + post_localSGD_hook +
//                                  PostLocalSGDOptimizer end to end
//   dopt_plsgd_peer join           Reducer + SGD under Join: rank 1 has two
//                                  batches fewer than the others
//
// Every check is against values this process computes itself. Rank r's
// gradient of parameter i at step t is a function of (r, t, i, element), so
// every process can compute every rank's gradient and run every rank's local
// optimizer (a plain dopt optimizer, the reference). Model averages are
// computed here from the references as sum_r (p_r / n), added in the order
// averagers.hpp documents (two ranks: p_0/2 + p_1/2; three or more: gloo's
// ring order, run b of segments summed from rank b-1 down to rank b), so parameters
// must match bitwise. Reducer gradients are n * k / 256 with |k| <= 32, so
// g / n and every partial sum is exact in float32, float16 and bfloat16:
// averages are exact whatever order the all-reduce adds in. One parameter
// (the "probe") carries the same non-representable value 1 + 2^-12 on every
// rank, which the float16/bfloat16 hooks must round (computed here with
// dopt::Half / dopt::BFloat16 arithmetic).
//
// stdout: "ok R <checks>" on success, otherwise "error KIND: MESSAGE" and exit
// status 1.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dopt/actors/distributed.hpp"
#include "dopt/actors/join.hpp"
#include "dopt/distributed/averagers.hpp"
#include "dopt/distributed/comm_hooks.hpp"
#include "dopt/distributed/post_local_sgd.hpp"
#include "dopt/distributed/reducer.hpp"
#include "dopt/optim/registry.hpp"
#include "dopt/runtime/error.hpp"
#include "dopt/runtime/state_dict.hpp"
#include "dopt/runtime/tensor.hpp"
#include "peer_main.hpp"
#include "reference_data.hpp"

namespace {

using dopt::DType;
using dopt::ProcessGroup;
using dopt::Shape;
using dopt::Tensor;
using dopt::optim::OptimizerParamGroup;
using dopt::optim::OptimizerSpec;
namespace fs = std::filesystem;
namespace optim = dopt::optim;

using dopt::testing::mix64;

std::uint64_t hash4(int r, int t, std::size_t i, std::int64_t k) {
  return mix64(mix64(mix64(mix64(static_cast<std::uint64_t>(r) + 1) + static_cast<std::uint64_t>(t)) +
                     static_cast<std::uint64_t>(i)) +
               static_cast<std::uint64_t>(k));
}

/// Local-SGD gradient (no averaging of gradients): a multiple of 1/256 in [-2, 2).
float local_grad_elem(int r, int t, std::size_t i, std::int64_t k) {
  return static_cast<float>(static_cast<std::int64_t>(hash4(r, t, i, k) % 1024) - 512) / 256.0f;
}

/// Reducer gradient: n * k / 256 with k in [-32, 32) (exact averages, header).
float reducer_grad_elem(int n, int r, int t, std::size_t i, std::int64_t k) {
  const auto q = static_cast<std::int64_t>(hash4(r, t + 1000, i, k) % 64) - 32;
  return static_cast<float>(n * q) / 256.0f;
}

/// Initial value of parameter i, element k.
float init_elem(std::size_t i, std::int64_t k) {
  const std::uint64_t h = mix64(mix64(1000003ull + i) + static_cast<std::uint64_t>(k));
  return static_cast<float>(static_cast<double>(h >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

constexpr float kProbe = 1.0f + 1.0f / 4096.0f;  // not a float16 / bfloat16 value

/// a += b, elementwise float32.
void add_into(const Tensor& a, const Tensor& b) {
  float* x = a.data<float>();
  const float* y = b.data<float>();
  for (std::int64_t k = 0; k < a.numel(); ++k) x[k] = x[k] + y[k];
}

using Checker = dopt::testing::Checker;

// ---------------------------------------------------------------------------------------------
// Model averaging

/// Shapes of the averaging model: 40000 and 70001 elements travel through
/// shared memory, the small ones inline; parameter 2 has no gradient at step 3 (an averaging
/// step of every schedule below).
const std::vector<Shape> kShapes{{5}, {40000}, {9}, {7, 11}, {70001}, {}};
constexpr std::size_t kSkipParam = 2;
constexpr int kSkipStep = 3;
bool has_grad(int t, std::size_t i) { return !(i == kSkipParam && t == kSkipStep); }

std::vector<Tensor> initial_params(const std::vector<Shape>& shapes) {
  std::vector<Tensor> ps;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    Tensor p = Tensor::empty(shapes[i], DType::float32);
    float* d = p.data<float>();
    for (std::int64_t k = 0; k < p.numel(); ++k) d[k] = init_elem(i, k);
    ps.push_back(p);
  }
  return ps;
}

OptimizerSpec spec_of(const std::string& opt) {
  if (opt == "Adam") return OptimizerSpec{"Adam", {{"lr", 0.01}, {"weight_decay", 0.1}}};
  return OptimizerSpec{"SGD", {{"lr", 0.1}, {"momentum", 0.9}}};
}

void set_local_grads(const std::vector<Tensor>& params, int r, int t) {
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (!has_grad(t, i)) {
      params[i].set_grad(Tensor());
      continue;
    }
    Tensor g = Tensor::empty(params[i].shape(), DType::float32);
    float* d = g.data<float>();
    for (std::int64_t k = 0; k < g.numel(); ++k) d[k] = local_grad_elem(r, t, i, k);
    params[i].set_grad(g);
  }
}

/// One rank's reference: its own parameters and a plain optimizer.
struct RankRef {
  std::vector<Tensor> params;
  std::unique_ptr<optim::Optimizer> opt;
  RankRef(const std::vector<Shape>& shapes, const OptimizerSpec& spec) : params(initial_params(shapes)) {
    opt = optim::make_optimizer(spec, {OptimizerParamGroup(params)});
  }
};

/// The average over `members` (global ranks, ascending = group rank order) of
/// the references' parameters that have a gradient, in averagers.hpp's
/// order; every member's reference gets it.
void reference_average(std::vector<RankRef>& refs, const std::vector<int>& members) {
  const int n = static_cast<int>(members.size());
  std::vector<std::size_t> idx;  // parameters with a gradient (same on every rank)
  const auto& p0 = refs[static_cast<std::size_t>(members[0])].params;
  std::int64_t total = 0;
  for (std::size_t i = 0; i < p0.size(); ++i)
    if (p0[i].grad().defined()) {
      idx.push_back(i);
      total += p0[i].numel();
    }
  // Each member's flat buffer, divided by n.
  std::vector<std::vector<float>> v(static_cast<std::size_t>(n), std::vector<float>(static_cast<std::size_t>(total)));
  for (int g = 0; g < n; ++g) {
    std::int64_t off = 0;
    for (std::size_t i : idx) {
      const Tensor p = refs[static_cast<std::size_t>(members[static_cast<std::size_t>(g)])].params[i].clone();
      const float* d = p.data<float>();
      for (std::int64_t k = 0; k < p.numel(); ++k) v[static_cast<std::size_t>(g)][static_cast<std::size_t>(off + k)] =
          d[k] / static_cast<float>(n);
      off += p.numel();
    }
  }
  std::vector<float> avg(static_cast<std::size_t>(total));
  if (n == 1) {
    avg = v[0];
  } else if (n == 2) {
    for (std::int64_t k = 0; k < total; ++k) avg[static_cast<std::size_t>(k)] = v[0][static_cast<std::size_t>(k)] + v[1][static_cast<std::size_t>(k)];
  } else {
    // gloo's ring (measured against torch 1.13): segments of at most 1 MiB,
    // at least 2n of them and a multiple of n, ceil(bytes / segments) bytes
    // each; run b of segments / n segments is summed from group rank b-1 down
    // to group rank b.
    auto up = [](std::int64_t x, std::int64_t m) { return (x + m - 1) / m * m; };
    const std::int64_t bytes = total * 4;
    const std::int64_t seg0 = up(std::min<std::int64_t>((bytes + 2 * n - 1) / (2 * n), 1 << 20), 4);
    const std::int64_t nseg = up(std::max<std::int64_t>((bytes + seg0 - 1) / seg0, 2 * n), n);
    const std::int64_t span = std::max<std::int64_t>(1, (nseg / n) * up((bytes + nseg - 1) / nseg, 4) / 4);
    for (std::int64_t k = 0; k < total; ++k) {
      const int b = static_cast<int>(std::min<std::int64_t>(k / span, n - 1));
      float acc = v[static_cast<std::size_t>(((b - 1) % n + n) % n)][static_cast<std::size_t>(k)];
      for (int j = 2; j <= n; ++j)
        acc = acc + v[static_cast<std::size_t>(((b - j) % n + n) % n)][static_cast<std::size_t>(k)];
      avg[static_cast<std::size_t>(k)] = acc;
    }
  }
  for (int m : members) {
    std::int64_t off = 0;
    for (std::size_t i : idx) {
      const Tensor& p = refs[static_cast<std::size_t>(m)].params[i];
      float* d = p.data<float>();
      for (std::int64_t k = 0; k < p.numel(); ++k) d[k] = avg[static_cast<std::size_t>(off + k)];
      off += p.numel();
    }
  }
}

/// Steps every rank's reference at step t: local gradients, a local step.
void reference_local_step(std::vector<RankRef>& refs, int t) {
  for (std::size_t r = 0; r < refs.size(); ++r) {
    set_local_grads(refs[r].params, static_cast<int>(r), t);
    refs[r].opt->step();
  }
}

std::vector<int> all_ranks(int n) {
  std::vector<int> v;
  for (int r = 0; r < n; ++r) v.push_back(r);
  return v;
}

std::unique_ptr<optim::PostLocalSGDOptimizer> make_plsgd(const OptimizerSpec& spec, const std::vector<Tensor>& params,
                                                        std::int64_t period, std::int64_t warmup, ProcessGroup world) {
  return std::make_unique<optim::PostLocalSGDOptimizer>(
      optim::make_optimizer(spec, {OptimizerParamGroup(params)}),
      std::make_unique<optim::PeriodicModelAverager>(period, warmup, world));
}

void periodic(ProcessGroup& world, Checker& c, const fs::path& tmp) {
  const int n = world.size(), me = world.rank();
  const int steps = 9, split = 5;  // the state dict round trip happens after step `split - 1`
  struct Sched {
    std::int64_t period, warmup;
  };
  for (const std::string opt : {"SGD", "Adam"})
    for (const Sched s : {Sched{2, 3}, Sched{3, 0}, Sched{1, 2}}) {
      const std::string tag = "periodic " + opt + " period " + std::to_string(s.period) + " warmup " +
                              std::to_string(s.warmup);
      const OptimizerSpec spec = spec_of(opt);
      std::vector<RankRef> refs;
      for (int r = 0; r < n; ++r) refs.emplace_back(kShapes, spec);
      auto params = initial_params(kShapes);
      auto plsgd = make_plsgd(spec, params, s.period, s.warmup, world);
      for (int t = 0; t < steps; ++t) {
        const std::string st = tag + ", step " + std::to_string(t);
        if (t == split) {
          // Round trip: state dict -> file -> a fresh optimizer and averager.
          const dopt::StateDict sd = plsgd->state_dict();
          auto it = sd.metadata.find(optim::kAveragerStepKey);
          c.expect(it != sd.metadata.end() && it->second == std::to_string(split), st + ": metadata step");
          const fs::path file = tmp / ("plsgd-" + opt + "-" + std::to_string(s.period) + "-rank" +
                                       std::to_string(me) + ".safetensors");
          dopt::save_state_dict(sd, file.string());
          plsgd = make_plsgd(spec, params, s.period, s.warmup, world);
          c.expect(plsgd->averager().step() == 0, st + ": a fresh averager starts at 0");
          plsgd->load_state_dict(dopt::load_state_dict(file.string()));
          c.expect(plsgd->averager().step() == split, st + ": averager step restored from the file");
          fs::remove(file);
        }
        const bool want_avg = t >= s.warmup && (t - s.warmup) % s.period == 0;
        c.expect(plsgd->averager().will_average() == want_avg, st + ": will_average");
        set_local_grads(params, me, t);
        plsgd->step();
        reference_local_step(refs, t);
        if (want_avg) reference_average(refs, all_ranks(n));
        c.expect(plsgd->averager().step() == t + 1, st + ": averager step");
        c.params(params, refs[static_cast<std::size_t>(me)].params, st);
      }
      // Without the step counter a loaded dict sets it to 0 (torch warns).
      dopt::StateDict sd = plsgd->state_dict();
      sd.metadata.erase(optim::kAveragerStepKey);
      plsgd->load_state_dict(sd);
      c.expect(plsgd->averager().step() == 0, tag + ": a dict without step resets the counter");
    }
  // The free functions on the world (no gradient filter).
  auto params = initial_params(kShapes);
  std::vector<RankRef> refs;
  for (int r = 0; r < n; ++r) refs.emplace_back(kShapes, spec_of("SGD"));
  reference_local_step(refs, 7);
  set_local_grads(params, me, 7);
  for (std::size_t i = 0; i < params.size(); ++i)
    params[i].copy_(refs[static_cast<std::size_t>(me)].params[i]);
  optim::average_parameters_or_parameter_groups(params, world);
  reference_average(refs, all_ranks(n));
  c.params(params, refs[static_cast<std::size_t>(me)].params, "average_parameters_or_parameter_groups");
}

void hierarchical(ProcessGroup& world, Checker& c) {
  const int n = world.size(), me = world.rank();
  if (n != 4) throw dopt::ValueError("hierarchical", "needs 4 processes, got " + std::to_string(n));
  struct Config {
    std::map<std::int64_t, int> sizes;
    std::int64_t warmup;
  };
  for (const Config& cfg : {Config{{{2, 2}, {4, 4}}, 1}, Config{{{1, 1}, {3, 2}, {6, 4}}, 2}}) {
    std::string tag = "hierarchical {";
    for (const auto& [p, g] : cfg.sizes) tag += std::to_string(p) + ": " + std::to_string(g) + ", ";
    tag += "} warmup " + std::to_string(cfg.warmup);
    const OptimizerSpec spec = spec_of("SGD");
    std::vector<RankRef> refs;
    for (int r = 0; r < n; ++r) refs.emplace_back(kShapes, spec);
    auto params = initial_params(kShapes);
    auto avg = std::make_unique<optim::HierarchicalModelAverager>(cfg.sizes, cfg.warmup, world);
    // The subgroups are contiguous blocks containing this rank.
    c.expect(avg->period_process_groups().size() == cfg.sizes.size(), tag + ": one group per period");
    for (const auto& [period, size] : cfg.sizes) {
      const ProcessGroup& g = avg->period_process_groups().at(period);
      c.expect(g.size() == size, tag + ": group size of period " + std::to_string(period));
      std::vector<int> want;
      for (int r = me / size * size; r < me / size * size + size; ++r) want.push_back(r);
      c.expect(g.ranks() == want, tag + ": members of the group of period " + std::to_string(period));
    }
    optim::PostLocalSGDOptimizer opt(optim::make_optimizer(spec, {OptimizerParamGroup(params)}), std::move(avg));
    for (int t = 0; t < 13; ++t) {
      const std::string st = tag + ", step " + std::to_string(t);
      set_local_grads(params, me, t);
      opt.step();
      reference_local_step(refs, t);
      if (t >= cfg.warmup) {
        for (auto it = cfg.sizes.rbegin(); it != cfg.sizes.rend(); ++it) {
          if (t % it->first != 0) continue;
          for (int b = 0; b < n; b += it->second) {
            std::vector<int> members;
            for (int r = b; r < b + it->second; ++r) members.push_back(r);
            reference_average(refs, members);
          }
          break;
        }
      }
      c.params(params, refs[static_cast<std::size_t>(me)].params, st);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Reducer

/// Reducer model: 7 parameters; with bucket caps of 4 KiB / 16 KiB there are
/// several buckets (one large parameter alone in its own); the last one is
/// the probe.
const std::vector<Shape> kRShapes{{300}, {20000}, {3, 50}, {1}, {9000}, {17}, {64}};
constexpr std::size_t kProbeParam = 6;

Tensor reducer_grad(int n, int r, int t, std::size_t i) {
  Tensor g = Tensor::empty(kRShapes[i], DType::float32);
  float* d = g.data<float>();
  for (std::int64_t k = 0; k < g.numel(); ++k)
    d[k] = i == kProbeParam ? static_cast<float>(n) * kProbe : reducer_grad_elem(n, r, t, i, k);
  return g;
}

enum class Hook { allreduce, fp16, bf16, post_local, post_local_noallreduce };
const char* hook_name(Hook h) {
  switch (h) {
    case Hook::allreduce: return "allreduce_hook";
    case Hook::fp16: return "fp16_compress_hook";
    case Hook::bf16: return "bf16_compress_hook";
    case Hook::post_local: return "post_localSGD_hook";
    default: return "post_localSGD_hook(post_local_gradient_allreduce=false)";
  }
}

/// The probe's average over m ranks (each holding x = n * kProbe) through a
/// hook's arithmetic; m divides n, so in float32 x / m and every partial sum
/// are exact, and float16/bfloat16 round x to n.
float probe_average(Hook h, int n, int m) {
  const float x = static_cast<float>(n) * kProbe;
  if (h == Hook::fp16) {
    const dopt::Half v(static_cast<float>(dopt::Half(x)) / static_cast<float>(m));
    dopt::Half acc = v;
    for (int j = 1; j < m; ++j) acc = dopt::Half(static_cast<float>(acc) + static_cast<float>(v));
    return static_cast<float>(acc);
  }
  if (h == Hook::bf16) {
    const dopt::BFloat16 v(static_cast<float>(dopt::BFloat16(x)) / static_cast<float>(m));
    dopt::BFloat16 acc = v;
    for (int j = 1; j < m; ++j) acc = dopt::BFloat16(static_cast<float>(acc) + static_cast<float>(v));
    return static_cast<float>(acc);
  }
  const float v = x / static_cast<float>(m);
  float acc = v;
  for (int j = 1; j < m; ++j) acc = acc + v;
  return acc;
}

/// sum over `members` (active ones) of grad(r) / divisor, exact (header).
Tensor exact_average(const std::vector<int>& members, const std::vector<bool>& active, int divisor,
                     const std::function<Tensor(int)>& grad_of) {
  Tensor acc;
  for (int r : members) {
    if (!active.empty() && !active[static_cast<std::size_t>(r)]) continue;
    Tensor g = grad_of(r);
    if (!acc.defined()) {
      acc = Tensor::zeros(g.shape(), DType::float32);
    }
    float* a = acc.data<float>();
    const float* d = g.data<float>();
    for (std::int64_t k = 0; k < g.numel(); ++k) a[k] = a[k] + d[k] / static_cast<float>(divisor);
  }
  return acc;
}

/// Subgroup of the post-local hook: blocks of 2 at an even world size, single ranks otherwise.
int subgroup_size(int n) { return n % 2 == 0 ? 2 : 1; }
std::vector<int> block_of(int me, int size) {
  std::vector<int> v;
  for (int r = me / size * size; r < me / size * size + size; ++r) v.push_back(r);
  return v;
}

/// What the hook should leave in rank me's gradient i at iteration t
/// (t counts synchronised iterations from 0; start: start_localSGD_iter).
Tensor expected_reduced(Hook h, int n, int me, int t, std::size_t i, int start) {
  std::vector<int> members = all_ranks(n);
  if (h == Hook::post_local || h == Hook::post_local_noallreduce) {
    if (t >= start) members = h == Hook::post_local ? block_of(me, subgroup_size(n)) : std::vector<int>{me};
  }
  const int m = static_cast<int>(members.size());
  if (i == kProbeParam) {
    const Hook arith = (h == Hook::fp16 || h == Hook::bf16) ? h : Hook::allreduce;
    return Tensor::full(kRShapes[i], probe_average(arith, n, m), DType::float32);
  }
  return exact_average(members, {}, m, [&](int r) { return reducer_grad(n, r, t, i); });
}

void reducer_hooks(ProcessGroup& world, Checker& c) {
  const int n = world.size(), me = world.rank();
  const int start = 2;
  for (Hook h : {Hook::allreduce, Hook::fp16, Hook::bf16, Hook::post_local, Hook::post_local_noallreduce})
    for (bool overlap : {true, false}) {
      const std::string tag = std::string(hook_name(h)) + (overlap ? " overlap" : " no overlap");
      auto params = initial_params(kRShapes);
      const optim::ReducerOptions o{.bucket_cap_bytes = 16 * 1024, .first_bucket_cap_bytes = 4096, .overlap = overlap};
      optim::Reducer reducer(params, world, o);
      c.expect(reducer.num_buckets() >= 3, tag + ": several buckets (" + std::to_string(reducer.num_buckets()) + ")");
      std::shared_ptr<optim::PostLocalSGDState> state;
      if (h == Hook::allreduce) reducer.register_comm_hook(optim::allreduce_hook(world));
      if (h == Hook::fp16) reducer.register_comm_hook(optim::fp16_compress_hook(world));
      if (h == Hook::bf16) reducer.register_comm_hook(optim::bf16_compress_hook(world));
      if (h == Hook::post_local || h == Hook::post_local_noallreduce) {
        ProcessGroup sub = world.new_subgroups(subgroup_size(n)).current;
        state = std::make_shared<optim::PostLocalSGDState>(world, sub, start, h == Hook::post_local);
        reducer.register_comm_hook(optim::post_localSGD_hook(state));
      }
      for (int t = 0; t < 4; ++t) {
        const std::string st = tag + ", iteration " + std::to_string(t);
        // Gradients become ready in a rank-dependent order.
        std::vector<std::size_t> order;
        for (std::size_t i = 0; i < params.size(); ++i) order.push_back(i);
        std::rotate(order.begin(), order.begin() + static_cast<std::ptrdiff_t>((me + t) % params.size()), order.end());
        if (me % 2) std::reverse(order.begin(), order.end());
        for (std::size_t i : order) {
          params[i].set_grad(reducer_grad(n, me, t, i));
          reducer.mark_ready(params[i]);
        }
        reducer.finalize();
        c.expect(reducer.num_iterations() == t + 1, st + ": iteration count");
        for (std::size_t i = 0; i < params.size(); ++i)
          c.bitwise(params[i].grad(), expected_reduced(h, n, me, t, i, start), st + ", gradient " + std::to_string(i));
        if (state) c.expect(state->iter == std::min(t + 1, start), st + ": PostLocalSGDState.iter");
      }
    }
}

void reducer_no_sync(ProcessGroup& world, Checker& c) {
  const int n = world.size(), me = world.rank();
  for (bool overlap : {true, false}) {
    const std::string tag = std::string("no_sync") + (overlap ? " overlap" : " no overlap");
    auto params = initial_params(kRShapes);
    const optim::ReducerOptions o{.bucket_cap_bytes = 16 * 1024, .first_bucket_cap_bytes = 4096, .overlap = overlap};
    optim::Reducer reducer(params, world, o);
    // Iterations 0 and 1 local (accumulating in p.grad()), 2 synchronised.
    {
      auto guard = reducer.no_sync();
      for (int t = 0; t < 2; ++t) {
        for (std::size_t i = params.size(); i-- > 0;) {
          Tensor g = reducer_grad(n, me, t, i);
          if (t == 0) params[i].set_grad(g);
          else add_into(params[i].grad(), g);
          reducer.mark_ready(params[i]);
        }
        reducer.finalize();
        c.expect(reducer.num_iterations() == 0, tag + ": local iterations are not counted");
        for (std::size_t i = 0; i < params.size(); ++i)
          c.bitwise(params[i].grad(),
                    exact_average({me}, {}, 1,
                                  [&](int r) {
                                    Tensor a = reducer_grad(n, r, 0, i);
                                    if (t == 1) add_into(a, reducer_grad(n, r, 1, i));
                                    return a;
                                  }),
                    tag + ": local gradient " + std::to_string(i) + " at iteration " + std::to_string(t));
      }
    }
    c.expect(reducer.require_sync(), tag + ": the guard restores synchronisation");
    for (std::size_t i = params.size(); i-- > 0;) {
      add_into(params[i].grad(), reducer_grad(n, me, 2, i));
      reducer.mark_ready(params[i]);
    }
    reducer.finalize();
    c.expect(reducer.num_iterations() == 1, tag + ": one synchronised iteration");
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (i == kProbeParam) {  // 3 n kProbe on every rank (exact); / n and the sum are exact
        c.bitwise(params[i].grad(), Tensor::full(kRShapes[i], 3.0f * static_cast<float>(n) * kProbe, DType::float32),
                  tag + ": accumulated probe");
        continue;
      }
      c.bitwise(params[i].grad(),
                exact_average(all_ranks(n), {}, n,
                              [&](int r) {
                                Tensor a = reducer_grad(n, r, 0, i);
                                add_into(a, reducer_grad(n, r, 1, i));
                                add_into(a, reducer_grad(n, r, 2, i));
                                return a;
                              }),
                tag + ": accumulated gradient " + std::to_string(i) + " averaged");
    }
  }
}

/// Reducer with post_localSGD_hook + PostLocalSGDOptimizer(SGD) (the whole
/// recipe): gradients averaged globally for `start` iterations, then on the
/// subgroups; parameters averaged on the world every 2 steps from `start`.
void reducer_post_local_sgd(ProcessGroup& world, Checker& c) {
  const int n = world.size(), me = world.rank();
  const int start = 2, steps = 7;
  const OptimizerSpec spec = spec_of("SGD");
  auto params = initial_params(kRShapes);
  optim::Reducer reducer(params, world, optim::ReducerOptions{.bucket_cap_bytes = 16 * 1024, .first_bucket_cap_bytes = 4096});
  optim::PostLocalSGDConfig cfg(world);
  cfg.subgroup = world.new_subgroups(subgroup_size(n)).current;
  cfg.start_localSGD_iter = start;
  cfg.period = 2;
  auto state = cfg.make_hook_state();
  reducer.register_comm_hook(optim::post_localSGD_hook(state));
  optim::PostLocalSGDOptimizer opt(optim::make_optimizer(spec, {OptimizerParamGroup(params)}), cfg.make_averager(),
                                   *state);
  std::vector<RankRef> refs;
  for (int r = 0; r < n; ++r) refs.emplace_back(kRShapes, spec);
  for (int t = 0; t < steps; ++t) {
    const std::string st = "reducer + PostLocalSGDOptimizer, step " + std::to_string(t);
    for (std::size_t i = params.size(); i-- > 0;) {
      params[i].set_grad(reducer_grad(n, me, t, i));
      reducer.mark_ready(params[i]);
    }
    reducer.finalize();
    opt.step();
    for (int r = 0; r < n; ++r) {
      auto& ref = refs[static_cast<std::size_t>(r)];
      for (std::size_t i = 0; i < params.size(); ++i) ref.params[i].set_grad(expected_reduced(Hook::post_local, n, r, t, i, start));
      ref.opt->step();
    }
    if (t >= start && (t - start) % 2 == 0) reference_average(refs, all_ranks(n));
    c.params(params, refs[static_cast<std::size_t>(me)].params, st);
  }
}

void reducer(ProcessGroup& world, Checker& c) {
  reducer_hooks(world, c);
  reducer_no_sync(world, c);
  reducer_post_local_sgd(world, c);
}

/// Batches of rank r: 5, except rank 1 which has 3.
int batches_of(int r) { return r == 1 ? 3 : 5; }

void join(ProcessGroup& world, Checker& c) {
  const int n = world.size(), me = world.rank();
  int most = 0;
  for (int r = 0; r < n; ++r) most = std::max(most, batches_of(r));
  for (bool overlap : {true, false}) {
    const std::string tag = std::string("join") + (overlap ? " overlap" : " no overlap");
    const OptimizerSpec spec = spec_of("SGD");
    // Reference: iteration t averages the gradients of the ranks that still
    // have batches (the joined ones count as zeros), divided by n.
    std::vector<Tensor> ref_params = initial_params(kRShapes);
    auto ref_opt = optim::make_optimizer(spec, {OptimizerParamGroup(ref_params)});
    auto step_ref = [&](int t) {
      std::vector<bool> active;
      for (int r = 0; r < n; ++r) active.push_back(t < batches_of(r));
      for (std::size_t i = 0; i < ref_params.size(); ++i) {
        if (i == kProbeParam) {
          float acc = 0.0f;
          for (int r = 0; r < n; ++r) acc = acc + (active[static_cast<std::size_t>(r)] ? kProbe : 0.0f);
          ref_params[i].set_grad(Tensor::full(kRShapes[i], acc, DType::float32));
          continue;
        }
        ref_params[i].set_grad(exact_average(all_ranks(n), active, n, [&](int r) { return reducer_grad(n, r, t, i); }));
      }
      ref_opt->step();
    };
    auto params = initial_params(kRShapes);
    optim::Reducer reducer(params, world, optim::ReducerOptions{.bucket_cap_bytes = 16 * 1024, .first_bucket_cap_bytes = 4096, .overlap = overlap});
    auto opt = optim::make_optimizer(spec, {OptimizerParamGroup(params)});
    dopt::Join j({&reducer});
    for (int t = 0; t < batches_of(me); ++t) {
      for (std::size_t i = params.size(); i-- > 0;) {
        params[i].set_grad(reducer_grad(n, me, t, i));
        reducer.mark_ready(params[i]);
      }
      reducer.finalize();
      opt->step();
      step_ref(t);
      c.params(params, ref_params, tag + ", batch " + std::to_string(t));
    }
    j.finish();
    for (int t = batches_of(me); t < most; ++t) step_ref(t);  // what the others did meanwhile
    c.expect(j.iterations() == most - batches_of(me), tag + ": join loop ran " + std::to_string(j.iterations()) +
                                                          " iterations, expected " +
                                                          std::to_string(most - batches_of(me)));
    if (batches_of(me) == most) c.params(params, ref_params, tag + ": parameters after the join");
    // After the Join, a plain synchronised iteration on every rank.
    for (std::size_t i = params.size(); i-- > 0;) {
      params[i].set_grad(reducer_grad(n, me, most, i));
      reducer.mark_ready(params[i]);
    }
    reducer.finalize();
    for (std::size_t i = 0; i < params.size(); ++i)
      c.bitwise(params[i].grad(), expected_reduced(Hook::allreduce, n, me, most, i, 0),
                tag + ": gradient " + std::to_string(i) + " after the join");
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "periodic";
  return dopt::testing::run_peer([&](ProcessGroup& world, int rank) {
    Checker c{rank};
    if (mode == "periodic") periodic(world, c, argc > 2 ? fs::path(argv[2]) : fs::temp_directory_path());
    else if (mode == "hierarchical") hierarchical(world, c);
    else if (mode == "reducer") reducer(world, c);
    else if (mode == "join") join(world, c);
    else throw dopt::testing::Usage{"dopt_plsgd_peer periodic [DIR] | hierarchical | reducer | join"};
    return c.checks;
  });
}
