// One rank of the real-process ZeroRedundancyOptimizer tests
// (tests/zero_multiprocess.test.cpp). Started by dopt-run or by hand; joins
// the world with dopt::init_process_group and runs one scenario:
//
//   dopt_zero_peer parity            ZeRO(Adam) and ZeRO(SGD, momentum), bucket
//                                    view off and on, two parameter groups
//                                    (one frozen parameter, one gradient left
//                                    out at one step), plus a 3-parameter model
//                                    (more ranks than parameters at 5); then
//                                    consolidate_state_dict on the last rank;
//                                    and ZeRO(Muon) on matrices, partition
//                                    weighted by Newton-Schulz cost
//   dopt_zero_peer save DIR          steps 0..2 at this world size N, then
//                                    save_sharded(DIR/<config>)
//   dopt_zero_peer load DIR N        at this world size M: load_sharded of a
//                                    checkpoint saved at N, steps 3..5
//   dopt_zero_peer join              uneven inputs under Join: rank 1 has two
//                                    batches fewer than the others
//   dopt_zero_peer overlap           overlap_with_ddp: ZeRO(Adam / SGD) stepped from
//                                    the reducer's comm hook (both hooks), two
//                                    groups, an lr change; the 3-parameter model
//                                    in one bucket (fewer buckets than ranks)
//   dopt_zero_peer overlap-join      overlap_with_ddp under Join, rank 1 (which
//                                    owns a bucket) has two batches fewer
//
// Every check is against values this process computes itself: per-rank
// gradients are a function of (rank, step, parameter index, element), so every
// process can compute every rank's gradient, average them and run a plain
// local optimizer (the reference) on the result. The gradients are multiples
// of 1/256 below 2 in magnitude, so their sum over up to 5 ranks is exact in
// float32 whatever order the all_reduce adds them in; the division by the
// world size is the same float32 operation on both sides. ZeRO runs the same
// kernels as the plain optimizer, so parameters and state must match
// bitwise.
//
// stdout: "ok R <checks>" on success, otherwise "error KIND: MESSAGE" and exit
// status 1.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "dopt/actors/distributed.hpp"
#include "dopt/actors/join.hpp"
#include "dopt/distributed/comm_hooks.hpp"
#include "dopt/distributed/reducer.hpp"
#include "dopt/optim/registry.hpp"
#include "dopt/distributed/zero.hpp"
#include "dopt/distributed/zero_overlap.hpp"
#include "dopt/runtime/error.hpp"
#include "dopt/runtime/tensor.hpp"
#include "peer_main.hpp"
#include "reference_data.hpp"

namespace {

using dopt::DType;
using dopt::ProcessGroup;
using dopt::ReduceOp;
using dopt::Shape;
using dopt::Tensor;
using dopt::optim::OptimizerParamGroup;
using dopt::optim::OptimizerSpec;
using dopt::optim::ZeroOptions;
using dopt::optim::ZeroRedundancyOptimizer;
namespace fs = std::filesystem;

using dopt::testing::mix64;

/// Rank r's gradient of parameter i at step t, element k: a multiple of 1/256 in [-2, 2).
float grad_elem(int r, int t, std::size_t i, std::int64_t k) {
  const std::uint64_t h = mix64(mix64(mix64(mix64(static_cast<std::uint64_t>(r) + 1) + static_cast<std::uint64_t>(t)) +
                                      static_cast<std::uint64_t>(i)) +
                                static_cast<std::uint64_t>(k));
  return static_cast<float>(static_cast<std::int64_t>(h % 1024) - 512) / 256.0f;
}

/// Initial value of parameter i, element k (any float; both sides start from it).
float init_elem(std::size_t i, std::int64_t k) {
  const std::uint64_t h = mix64(mix64(1000003ull + i) + static_cast<std::uint64_t>(k));
  return static_cast<float>(static_cast<double>(h >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

struct Model {
  std::vector<Shape> shapes;
  std::vector<std::vector<std::size_t>> groups;  // parameter indices per group
  std::vector<dopt::Hyperparams> overrides;      // per group
  std::size_t frozen = SIZE_MAX;                 // requires_grad false, never a grad
  std::size_t skip_param = SIZE_MAX;             // no grad at step skip_step
  int skip_step = -1;
  std::size_t n() const { return shapes.size(); }
  bool has_grad(int t, std::size_t i) const { return i != frozen && !(i == skip_param && t == skip_step); }
};

/// Two groups; 40000 and 70001 elements travel through shared memory, the
/// small ones inline.
Model big_model(const std::string& opt) {
  Model m;
  m.shapes = {{5}, {40000}, {9}, {3}, {7, 11}, {1}, {70001}, {4, 3}, {}};
  m.groups = {{0, 1, 2, 3, 4}, {5, 6, 7, 8}};
  if (opt == "Adam") m.overrides = {{{"lr", 0.05}}, {}};
  else m.overrides = {{}, {{"lr", 0.02}, {"nesterov", true}, {"dampening", 0.0}}};
  m.frozen = 3;
  m.skip_param = 7;
  m.skip_step = 1;
  return m;
}

/// Three parameters: at 5 ranks, two ranks own nothing.
Model tiny_model() {
  Model m;
  m.shapes = {{6}, {2000}, {1}};
  m.groups = {{0, 1, 2}};
  m.overrides = {{}};
  return m;
}

/// Matrices only, for Muon: two groups, one gradient left out at one step.
Model muon_model() {
  Model m;
  m.shapes = {{24, 40}, {40, 24}, {16, 64}, {8, 8}, {3, 5}, {64, 16}};
  m.groups = {{0, 1, 2}, {3, 4, 5}};
  m.overrides = {{}, {{"lr", 0.01}, {"nesterov", false}, {"adjust_lr_fn", "match_rms_adamw"}}};
  m.skip_param = 4;
  m.skip_step = 1;
  return m;
}

OptimizerSpec spec_of(const std::string& opt) {
  if (opt == "Adam") return OptimizerSpec{"Adam", {{"lr", 0.01}, {"weight_decay", 0.1}}};
  if (opt == "Muon") return OptimizerSpec{"Muon", {{"lr", 0.02}, {"weight_decay", 0.05}}};
  return OptimizerSpec{"SGD", {{"lr", 0.1}, {"momentum", 0.9}}};
}

std::vector<Tensor> initial_params(const Model& m) {
  std::vector<Tensor> ps;
  for (std::size_t i = 0; i < m.n(); ++i) {
    Tensor p = Tensor::empty(m.shapes[i], DType::float32);
    float* d = p.data<float>();
    for (std::int64_t k = 0; k < p.numel(); ++k) d[k] = init_elem(i, k);
    if (i == m.frozen) p.set_requires_grad(false);
    ps.push_back(p);
  }
  return ps;
}

std::vector<OptimizerParamGroup> make_groups(const Model& m, const OptimizerSpec& spec,
                                             const std::vector<Tensor>& params) {
  std::vector<OptimizerParamGroup> out;
  for (std::size_t g = 0; g < m.groups.size(); ++g) {
    std::vector<Tensor> ps;
    for (auto i : m.groups[g]) ps.push_back(params[i]);
    dopt::Hyperparams h = spec.hyperparameters;
    for (const auto& [k, v] : m.overrides[g]) h[k] = v;
    out.emplace_back(std::move(ps), dopt::optim::make_options(OptimizerSpec{spec.name, h}));
  }
  return out;
}

/// Rank r's own gradient of parameter i at step t (zeros for an inactive rank).
Tensor rank_grad(int r, int t, std::size_t i, const Shape& s, bool active = true) {
  Tensor g = Tensor::zeros(s, DType::float32);
  if (!active) return g;
  float* d = g.data<float>();
  for (std::int64_t k = 0; k < g.numel(); ++k) d[k] = grad_elem(r, t, i, k);
  return g;
}

/// The average over `world` ranks computed here (rank order; exact sums).
Tensor averaged_grad(int world, int t, std::size_t i, const Shape& s, const std::vector<bool>& active = {}) {
  Tensor acc = Tensor::zeros(s, DType::float32);
  float* a = acc.data<float>();
  for (int r = 0; r < world; ++r) {
    if (!active.empty() && !active[static_cast<std::size_t>(r)]) continue;
    Tensor g = rank_grad(r, t, i, s);
    const float* d = g.data<float>();
    for (std::int64_t k = 0; k < acc.numel(); ++k) a[k] = a[k] + d[k];
  }
  for (std::int64_t k = 0; k < acc.numel(); ++k) a[k] = a[k] / static_cast<float>(world);
  return acc;
}

struct Checker : dopt::testing::Checker {
  void state(const dopt::StateDict& got, const dopt::StateDict& want, const std::string& what) {
    expect(got.param_groups.size() == want.param_groups.size(), what + ": group count");
    for (std::size_t g = 0; g < got.param_groups.size(); ++g) {
      expect(got.param_groups[g].params == want.param_groups[g].params, what + ": indices of group " + std::to_string(g));
      expect(got.param_groups[g].hyperparams == want.param_groups[g].hyperparams,
             what + ": hyperparameters of group " + std::to_string(g));
    }
    expect(got.state.size() == want.state.size(), what + ": " + std::to_string(got.state.size()) +
                                                      " state entries, the reference has " +
                                                      std::to_string(want.state.size()));
    for (const auto& [idx, st] : want.state) {
      auto it = got.state.find(idx);
      expect(it != got.state.end(), what + ": no state for parameter " + std::to_string(idx));
      expect(it->second.size() == st.size(), what + ": keys of parameter " + std::to_string(idx));
      for (const auto& [key, t] : st) {
        auto kt = it->second.find(key);
        expect(kt != it->second.end(), what + ": no '" + key + "' for parameter " + std::to_string(idx));
        bitwise(kt->second, t, what + ": '" + key + "' of parameter " + std::to_string(idx));
      }
    }
  }
};

/// Sets this rank's averaged gradients for step t through all_reduce(sum) /
/// world, like DDP, and checks them against the independently computed average.
void set_averaged_grads(const Model& m, ProcessGroup& world, const std::vector<Tensor>& params, int t, Checker& c) {
  for (std::size_t i = 0; i < m.n(); ++i) {
    if (!m.has_grad(t, i)) {
      params[i].set_grad(Tensor());
      continue;
    }
    Tensor g = rank_grad(world.rank(), t, i, m.shapes[i]);
    world.all_reduce(g, ReduceOp::sum);
    float* d = g.data<float>();
    for (std::int64_t k = 0; k < g.numel(); ++k) d[k] = d[k] / static_cast<float>(world.size());
    c.bitwise(g, averaged_grad(world.size(), t, i, m.shapes[i]), "averaged gradient " + std::to_string(i));
    params[i].set_grad(g);
  }
}

/// The reference: a plain optimizer stepping on the averaged gradients.
struct Reference {
  std::vector<Tensor> params;
  std::unique_ptr<dopt::optim::Optimizer> opt;
  const Model& m;
  Reference(const Model& model, const OptimizerSpec& spec) : params(initial_params(model)), m(model) {
    opt = dopt::optim::make_optimizer(spec, make_groups(model, spec, params));
  }
  void step(int world, int t) {
    for (std::size_t i = 0; i < m.n(); ++i)
      params[i].set_grad(m.has_grad(t, i) ? averaged_grad(world, t, i, m.shapes[i]) : Tensor());
    opt->step();
  }
};

std::unique_ptr<ZeroRedundancyOptimizer> make_zero(const Model& m, const OptimizerSpec& spec,
                                                   const std::vector<Tensor>& params, ProcessGroup& world,
                                                   bool bucket) {
  ZeroOptions o;
  o.process_group = world;
  o.parameters_as_bucket_view = bucket;
  // Muon: the partition balances the Newton-Schulz work.
  if (spec.name == "Muon") o.partition_weight = dopt::optim::ZeroPartitionWeight::step_cost;
  return std::make_unique<ZeroRedundancyOptimizer>(make_groups(m, spec, params), spec, o);
}

void parity_one(ProcessGroup& world, Checker& c, const Model& m, const std::string& opt, bool bucket,
                const std::string& name) {
  const int steps = 4;
  const OptimizerSpec spec = spec_of(opt);
  const std::string tag = name + " " + opt + (bucket ? " bucket_view" : "");
  auto params = initial_params(m);
  auto zero = make_zero(m, spec, params, world, bucket);
  Reference ref(m, spec);
  // Ownership: every parameter has exactly one owner; the local optimizer
  // holds exactly this rank's parameters.
  const auto owners = zero->param_owners();
  c.expect(owners.size() == m.n(), tag + ": owners");
  std::size_t mine = 0;
  for (int o : owners) {
    c.expect(o >= 0 && o < world.size(), tag + ": owner in range");
    if (o == world.rank()) ++mine;
  }
  std::size_t local = 0;
  for (const auto& g : zero->optim().param_groups()) local += g.params.size();
  c.expect(local == mine, tag + ": the local optimizer holds this rank's parameters");
  if (static_cast<std::size_t>(world.size()) > m.n() && world.rank() >= static_cast<int>(m.n()))
    c.expect(mine == 0, tag + ": a surplus rank owns nothing");
  for (int t = 0; t < steps; ++t) {
    set_averaged_grads(m, world, params, t, c);
    zero->step();
    ref.step(world.size(), t);
    c.params(params, ref.params, tag + ", step " + std::to_string(t));
  }
  c.expect(zero->step_count() == steps, tag + ": step_count");
  // consolidate_state_dict on the last rank (a non-zero one when W > 1).
  const int to = world.size() - 1;
  zero->consolidate_state_dict(to);
  const dopt::StateDict want = ref.opt->state_dict();
  if (world.rank() == to) {
    c.state(zero->state_dict(), want, tag + ": state_dict on rank " + std::to_string(to));
  } else {
    bool threw = false;
    try {
      (void)zero->state_dict();
    } catch (const dopt::StateError& e) {
      threw = std::string(e.what()).find("consolidate_state_dict(to=") != std::string::npos;
    }
    c.expect(threw, tag + ": state_dict on an unconsolidated rank throws StateError");
  }
  // A new consolidation on rank 0 wipes the one on the last rank.
  zero->consolidate_state_dict(0);
  if (world.rank() == 0) c.state(zero->state_dict(), want, tag + ": state_dict on rank 0");
  if (world.rank() != 0) {
    bool threw = false;
    try {
      (void)zero->state_dict();
    } catch (const dopt::StateError&) {
      threw = true;
    }
    c.expect(threw, tag + ": an earlier consolidation is wiped");
  }
  // The local state is a share: this rank's parameters only.
  std::int64_t ref_bytes = 0;
  for (std::size_t i = 0; i < m.n(); ++i)
    if (owners[i] == world.rank()) {
      auto it = want.state.find(static_cast<std::int64_t>(i));
      if (it == want.state.end()) continue;
      for (const auto& [k, t] : it->second) ref_bytes += static_cast<std::int64_t>(t.nbytes());
    }
  c.expect(zero->local_state_bytes() == ref_bytes, tag + ": local state bytes");
}

void parity(ProcessGroup& world, Checker& c) {
  for (const std::string opt : {"Adam", "SGD"})
    for (bool bucket : {false, true}) {
      parity_one(world, c, big_model(opt), opt, bucket, "two groups");
      parity_one(world, c, tiny_model(), opt, bucket, "three params");
    }
  // Muon: each matrix orthogonalised whole on its owner, the same bits as one Muon.
  for (bool bucket : {false, true}) parity_one(world, c, muon_model(), "Muon", bucket, "matrices");
}

// Checkpoint configurations: (optimizer, bucket view).
const std::vector<std::pair<std::string, bool>> kCkptConfigs{{"Adam", false}, {"Adam", true}, {"SGD", true}};
constexpr int kSavedSteps = 3;
constexpr int kResumedSteps = 3;

std::string config_dir(const std::string& dir, const std::string& opt, bool bucket) {
  return (fs::path(dir) / (opt + (bucket ? "-bucket" : "-plain"))).string();
}

void save(ProcessGroup& world, Checker& c, const std::string& dir) {
  for (const auto& [opt, bucket] : kCkptConfigs) {
    const Model m = big_model(opt);
    const OptimizerSpec spec = spec_of(opt);
    auto params = initial_params(m);
    auto zero = make_zero(m, spec, params, world, bucket);
    Reference ref(m, spec);
    for (int t = 0; t < kSavedSteps; ++t) {
      set_averaged_grads(m, world, params, t, c);
      zero->step();
      ref.step(world.size(), t);
      c.params(params, ref.params, "save " + opt + (bucket ? " bucket_view" : "") + ", step " + std::to_string(t));
    }
    const std::string d = config_dir(dir, opt, bucket);
    zero->save_sharded(d);
    c.expect(fs::exists(fs::path(d) / ZeroRedundancyOptimizer::shard_file_name(world.rank(), world.size())),
             "shard file written");
  }
}

void load(ProcessGroup& world, Checker& c, const std::string& dir, int saved_world) {
  for (const auto& [opt, bucket] : kCkptConfigs) {
    const Model m = big_model(opt);
    const OptimizerSpec spec = spec_of(opt);
    const std::string tag = "resume " + opt + (bucket ? " bucket_view" : "") + " saved at " +
                            std::to_string(saved_world) + ", loaded at " + std::to_string(world.size());
    // The uninterrupted run: steps 0..2 averaged over the saving world, then
    // steps 3..5 averaged over this one, with one plain optimizer.
    Reference ref(m, spec);
    for (int t = 0; t < kSavedSteps; ++t) ref.step(saved_world, t);
    // Parameter values come from the "model checkpoint": the reference's.
    auto params = initial_params(m);
    for (std::size_t i = 0; i < m.n(); ++i) params[i].copy_(ref.params[i]);
    auto zero = make_zero(m, spec, params, world, bucket);
    const auto report = zero->load_sharded(config_dir(dir, opt, bucket));
    c.expect(report.saved_world_size == saved_world, tag + ": saved world size " +
                                                         std::to_string(report.saved_world_size));
    c.expect(zero->step_count() == kSavedSteps, tag + ": step count restored");
    // Only the shards that held this rank's parameters at the old partition
    // are opened (which ones is not recomputed here: each one at most once,
    // in rank order, and one at least when this rank owns anything).
    std::size_t owned = 0;
    for (int o : zero->param_owners()) owned += o == world.rank() ? 1 : 0;
    c.expect((owned == 0) == report.shards_read.empty(), tag + ": shards read only when needed");
    for (std::size_t k = 0; k < report.shards_read.size(); ++k) {
      c.expect(report.shards_read[k] >= 0 && report.shards_read[k] < saved_world, tag + ": shard index in range");
      if (k > 0) c.expect(report.shards_read[k - 1] < report.shards_read[k], tag + ": shards opened once, ascending");
    }
    for (int t = kSavedSteps; t < kSavedSteps + kResumedSteps; ++t) {
      set_averaged_grads(m, world, params, t, c);
      zero->step();
      ref.step(world.size(), t);
      c.params(params, ref.params, tag + ", step " + std::to_string(t));
    }
    zero->consolidate_state_dict(0);
    if (world.rank() == 0) c.state(zero->state_dict(), ref.opt->state_dict(), tag + ": final state");
  }
}

// A minimal DDP stand-in (as in distributed/src/zero/zero.test.cpp): averages this
// iteration's gradients over all ranks; its join hook shadows the all-reduces
// with zeros and leaves the averaged gradients in place.
class GradAverager : public dopt::Joinable {
 public:
  GradAverager(ProcessGroup g, std::vector<Tensor> params) : group_(std::move(g)), params_(std::move(params)) {}
  void average(const std::vector<Tensor>& grads) {
    dopt::Join::notify_join_context(*this).get();
    for (std::size_t i = 0; i < params_.size(); ++i) reduce(i, grads[i].clone());
  }
  std::unique_ptr<dopt::JoinHook> join_hook() override { return std::make_unique<Hook>(*this); }
  dopt::Device join_device() const override { return dopt::Device::cpu(); }
  ProcessGroup join_process_group() const override { return group_; }
  int hook_calls = 0;

 private:
  void reduce(std::size_t i, Tensor g) {
    group_.all_reduce(g, ReduceOp::sum);
    float* d = g.data<float>();
    for (std::int64_t k = 0; k < g.numel(); ++k) d[k] = d[k] / static_cast<float>(group_.size());
    params_[i].set_grad(g);
  }
  struct Hook : dopt::JoinHook {
    explicit Hook(GradAverager& a) : avg(a) {}
    void main_hook() override {
      ++avg.hook_calls;
      for (std::size_t i = 0; i < avg.params_.size(); ++i)
        avg.reduce(i, Tensor::zeros(avg.params_[i].shape(), avg.params_[i].dtype()));
    }
    GradAverager& avg;
  };
  ProcessGroup group_;
  std::vector<Tensor> params_;
};

/// Batches of rank r: 5, except rank 1 which has 3.
int batches_of(int r) { return r == 1 ? 3 : 5; }

/// The iterations of a join run over n ranks: the most batches a rank has.
int most_batches(int n) {
  int most = 0;
  for (int r = 0; r < n; ++r) most = std::max(most, batches_of(r));
  return most;
}

/// Which of n ranks still have a batch at iteration t.
std::vector<bool> active_at(int n, int t) {
  std::vector<bool> active;
  for (int r = 0; r < n; ++r) active.push_back(t < batches_of(r));
  return active;
}

/// The model of the join cases: big_model(opt), every parameter trained.
Model join_model(const std::string& opt) {
  Model m = big_model(opt);
  m.frozen = SIZE_MAX;
  m.skip_param = SIZE_MAX;
  return m;
}

/// Steps ref as the reference of a join run over n ranks: iteration t
/// averages, with grad_of (averaged_grad or ddp_averaged_grad), the gradients
/// of the ranks that still have batches (the others contribute zeros),
/// divided by the world size.
template <class GradOf>
void step_join_reference(Reference& ref, int n, GradOf grad_of) {
  for (int t = 0; t < most_batches(n); ++t) {
    const std::vector<bool> active = active_at(n, t);
    for (std::size_t i = 0; i < ref.m.n(); ++i) ref.params[i].set_grad(grad_of(n, t, i, ref.m.shapes[i], active));
    ref.opt->step();
  }
}

void join(ProcessGroup& world, Checker& c) {
  const int me = world.rank(), n = world.size();
  const int most = most_batches(n);
  for (const std::string opt : {"Adam", "SGD"})
    for (bool bucket : {false, true}) {
      const std::string tag = "join " + opt + (bucket ? " bucket_view" : "");
      const Model m = join_model(opt);
      const OptimizerSpec spec = spec_of(opt);
      Reference ref(m, spec);
      step_join_reference(ref, n, averaged_grad);
      auto params = initial_params(m);
      auto zero = make_zero(m, spec, params, world, bucket);
      GradAverager avg(world, params);
      dopt::Join j({&avg, zero.get()});
      for (int t = 0; t < batches_of(me); ++t) {
        std::vector<Tensor> grads;
        for (std::size_t i = 0; i < m.n(); ++i) grads.push_back(rank_grad(me, t, i, m.shapes[i]));
        avg.average(grads);
        zero->step();
      }
      j.finish();
      c.expect(j.iterations() == most - batches_of(me), tag + ": join loop ran " + std::to_string(j.iterations()) +
                                                            " iterations, expected " +
                                                            std::to_string(most - batches_of(me)));
      c.expect(avg.hook_calls == most - batches_of(me), tag + ": hook calls");
      c.expect(zero->step_count() == most, tag + ": every rank stepped " + std::to_string(most) + " times");
      c.params(params, ref.params, tag + ": parameters after the join");
      // After the Join, plain steps again on every rank (no notify all-reduce).
      set_averaged_grads(m, world, params, most, c);
      zero->step();
      ref.step(n, most);
      c.params(params, ref.params, tag + ": a step after the join");
    }
}

// --- overlap_with_ddp ------------------------------------------------------------

/// What the reducer's allreduce_hook gives: sum over ranks in rank order of
/// g_r / world (divide first, as torch), inactive ranks contributing zeros.
Tensor ddp_averaged_grad(int world, int t, std::size_t i, const Shape& s, const std::vector<bool>& active = {}) {
  Tensor acc;
  for (int r = 0; r < world; ++r) {
    const bool on = active.empty() || active[static_cast<std::size_t>(r)];
    Tensor g = rank_grad(r, t, i, s, on);
    float* d = g.data<float>();
    for (std::int64_t k = 0; k < g.numel(); ++k) d[k] = d[k] / static_cast<float>(world);
    if (r == 0) {
      acc = g;
      continue;
    }
    float* a = acc.data<float>();
    for (std::int64_t k = 0; k < acc.numel(); ++k) a[k] = a[k] + d[k];
  }
  return acc;
}

/// One backward: this rank's gradients released in reverse order (as a
/// backward pass produces them), then finalize() and step().
void backward(dopt::optim::Reducer& red, ZeroRedundancyOptimizer& zero, const Model& m,
              const std::vector<Tensor>& params, int rank, int t) {
  for (std::size_t i = m.n(); i-- > 0;) {
    params[i].set_grad(rank_grad(rank, t, i, m.shapes[i]));
    red.mark_ready(params[i]);
  }
  red.finalize();
  zero.step();
}

std::unique_ptr<ZeroRedundancyOptimizer> make_overlap_zero(const Model& m, const OptimizerSpec& spec,
                                                           const std::vector<Tensor>& params, ProcessGroup& world) {
  ZeroOptions o;
  o.process_group = world;
  o.overlap_with_ddp = true;
  return std::make_unique<ZeroRedundancyOptimizer>(make_groups(m, spec, params), spec, o);
}

const auto kOverlapBuckets = dopt::optim::ReducerOptions{.bucket_cap_bytes = 1000, .first_bucket_cap_bytes = 100};

void overlap_one(ProcessGroup& world, Checker& c, const Model& m, const std::string& opt, bool interleaved,
                 dopt::optim::ReducerOptions ropts, const std::string& name) {
  const int steps = 4;
  const OptimizerSpec spec = spec_of(opt);
  const std::string tag = name + " " + opt + (interleaved ? " interleaved" : " after backward");
  auto params = initial_params(m);
  auto zero = make_overlap_zero(m, spec, params, world);
  dopt::optim::Reducer red(params, world, ropts);
  auto inner = dopt::optim::allreduce_hook(world);
  red.register_comm_hook(interleaved ? dopt::optim::hook_with_zero_step_interleaved(inner, red, *zero)
                                     : dopt::optim::hook_with_zero_step(inner, red, *zero));
  Reference ref(m, spec);
  // The plan: one owner per bucket, the partition follows it.
  const auto bucket_owners = zero->overlap_bucket_owners();
  const auto buckets = red.bucket_indices();
  c.expect(bucket_owners.size() == buckets.size(), tag + ": one owner per bucket");
  const auto owners = zero->param_owners();
  for (std::size_t b = 0; b < buckets.size(); ++b)
    for (auto i : buckets[b]) c.expect(owners[i] == bucket_owners[b], tag + ": a parameter's owner is its bucket's");
  std::size_t mine = 0, local = 0;
  for (int o : owners) mine += o == world.rank() ? 1 : 0;
  for (const auto& g : zero->optim().param_groups()) local += g.params.size();
  c.expect(local == mine, tag + ": the local optimizer holds this rank's parameters");
  for (int t = 0; t < steps; ++t) {
    if (t == 2)  // an lr change between iterations takes effect (torch's functional path ignores it)
      for (auto* groups : {&zero->param_groups(), &ref.opt->param_groups()}) {
        auto& o = *(*groups)[0].options;
        o.set_lr(o.get_lr() * 0.25);
      }
    backward(red, *zero, m, params, world.rank(), t);
    for (std::size_t i = 0; i < m.n(); ++i) {
      Tensor g = ddp_averaged_grad(world.size(), t, i, m.shapes[i]);
      c.bitwise(params[i].grad(), g, tag + ": reduced gradient " + std::to_string(i));
      ref.params[i].set_grad(g);
    }
    ref.opt->step();
    c.params(params, ref.params, tag + ", step " + std::to_string(t));
  }
  c.expect(zero->step_count() == steps, tag + ": step_count");
  const int to = world.size() - 1;
  zero->consolidate_state_dict(to);
  if (world.rank() == to) c.state(zero->state_dict(), ref.opt->state_dict(), tag + ": consolidated state");
}

void overlap(ProcessGroup& world, Checker& c) {
  for (const std::string opt : {"Adam", "SGD"})
    for (bool interleaved : {true, false}) {
      Model m = big_model(opt);
      m.frozen = SIZE_MAX;  // the reducer reduces (and ZeRO steps) every parameter
      m.skip_param = SIZE_MAX;
      overlap_one(world, c, m, opt, interleaved, kOverlapBuckets, "two groups");
    }
  // One bucket for everything: at 3 and 5 ranks the others own nothing.
  overlap_one(world, c, tiny_model(), "Adam", true,
              dopt::optim::ReducerOptions{.bucket_cap_bytes = 1u << 20, .first_bucket_cap_bytes = 1u << 20}, "one bucket");
}

void overlap_join(ProcessGroup& world, Checker& c) {
  const int me = world.rank(), n = world.size();
  const int most = most_batches(n);
  for (const std::string opt : {"Adam", "SGD"}) {
    const std::string tag = "overlap join " + opt;
    const Model m = join_model(opt);
    const OptimizerSpec spec = spec_of(opt);
    Reference ref(m, spec);
    step_join_reference(ref, n, ddp_averaged_grad);
    auto params = initial_params(m);
    auto zero = make_overlap_zero(m, spec, params, world);
    dopt::optim::Reducer red(params, world, kOverlapBuckets);
    red.register_comm_hook(
        dopt::optim::hook_with_zero_step_interleaved(dopt::optim::allreduce_hook(world), red, *zero));
    const auto owners = zero->overlap_bucket_owners();
    c.expect(std::count(owners.begin(), owners.end(), 1) > 0, tag + ": rank 1 (the one that joins) owns a bucket");
    dopt::Join j({&red, zero.get()});
    for (int t = 0; t < batches_of(me); ++t) {
      backward(red, *zero, m, params, me, t);
      const std::vector<bool> active = active_at(n, t);
      for (std::size_t i = 0; i < m.n(); ++i)
        c.bitwise(params[i].grad(), ddp_averaged_grad(n, t, i, m.shapes[i], active),
                  tag + ": reduced gradient " + std::to_string(i) + " at iteration " + std::to_string(t));
    }
    j.finish();
    c.expect(j.iterations() == most - batches_of(me), tag + ": join loop iterations");
    c.expect(zero->step_count() == most, tag + ": every rank ran " + std::to_string(most) + " iterations");
    // Every rank, the joined one included, holds the trained parameters.
    c.params(params, ref.params, tag + ": parameters after the join");
    zero->consolidate_state_dict(0);
    if (me == 0) c.state(zero->state_dict(), ref.opt->state_dict(), tag + ": consolidated state");
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "parity";
  return dopt::testing::run_peer([&](ProcessGroup& world, int rank) {
    Checker c{{rank}};
    if (mode == "parity") parity(world, c);
    else if (mode == "save" && argc > 2) save(world, c, argv[2]);
    else if (mode == "load" && argc > 3) load(world, c, argv[2], std::stoi(argv[3]));
    else if (mode == "join") join(world, c);
    else if (mode == "overlap") overlap(world, c);
    else if (mode == "overlap-join") overlap_join(world, c);
    else throw dopt::testing::Usage{"dopt_zero_peer parity | save DIR | load DIR SAVED_WORLD | join | overlap | overlap-join"};
    return c.checks;
  });
}
