// One rank of the post-local SGD and DiLoCo growing-back tests between real
// processes (tests/replace_multiprocess.test.cpp), started by dopt-run
// --on-failure replace on the shm plane (the default) or on the actor plane
// (DOPT_TRANSPORT=tcp):
//
//   dopt_local_sgd_grow_peer MODE VICTIM LOST_AT JOIN_AT STEPS
//     MODE plsgd: PostLocalSGDOptimizer (Adam, PeriodicModelAverager with
//       warm-up 1 and period 2: averages at steps 1, 3, 5, ...), surviving
//       losses (enable_survive). Rank VICTIM kills itself (SIGKILL) before
//       step LOST_AT's gradients; the others notice it at the next average
//       (MembershipChangedError: that average is the survivors').
//     MODE diloco: streaming DiLoCo (inner SGD with momentum, outer Nesterov
//       SGD, 2 fragments, sync_every 4, delay 1: at step t fragment (t / 2) % 2
//       is prepared when t is even, synced when t is odd). LOST_AT is a
//       prepare: its average fails, the sync after it puts the fragment back
//       at its anchors and throws PeerLostError; the survivors rebuild their
//       optimizer over the shrunk group with the same state.
//     Before step JOIN_AT the survivors grow() the averager's group by one and
//     post_local_sgd_catch_up(); VICTIM's replacement (DOPT_REPLACES)
//     join_group()s, builds its optimizer over the grown group and catches
//     up (parameters and state of group rank 0). All train to step STEPS and
//     compare their parameters bitwise with the reference below.
//
// The reference, computed by every process for every rank: each rank's own
// inner optimizer on its own gradients (survive_reference::grad_elem, rank
// r's at step t); the ranks there at step t are all but VICTIM at LOST_AT <= t
// < JOIN_AT; at JOIN_AT, VICTIM (the newcomer takes its rank, and so its
// place in the grown group) becomes a copy of rank 0's parameters and inner
// optimizer state. The averages are over the ranks there, in group rank order
// (ascending), added in gloo's ring order (ring_order_reference.hpp): for
// plsgd sum_r (p_r / n) over all parameters; for diloco the deltas anchor -
// p_r over the fragment's parameters, summed, then / n, applied by the
// fragment's outer SGD at the sync (alpha 0: every rank takes the anchors).
//
// Prints "ok R CHECKS" or "error KIND: MESSAGE" (tests/support/peer_main.hpp).
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "dopt/distributed/diloco.hpp"
#include "dopt/distributed/post_local_sgd.hpp"
#include "dopt/optim/registry.hpp"
#include "local_sgd/ring_order_reference.hpp"
#include "peer_main.hpp"
#include "zero/zero_survive_reference.hpp"

namespace {

using dopt::ProcessGroup;
using dopt::StateDict;
using dopt::Tensor;
using namespace dopt::optim;
namespace sref = dopt::optim::survive_reference;

const std::vector<std::int64_t> kSizes = {257, 64, 3000, 33, 5, 300};
// plsgd
const OptimizerSpec kAdam{"Adam", {{"lr", 0.01}, {"weight_decay", 0.1}}};
constexpr std::int64_t kWarmup = 1, kPeriod = 2;
// diloco
const std::vector<std::vector<std::int64_t>> kFragments = {{0, 2, 4}, {1, 3, 5}};
const OptimizerSpec kInner{"SGD", {{"lr", 0.05}, {"momentum", 0.9}}};
const OptimizerSpec kOuter{"SGD", {{"lr", 0.7}, {"momentum", 0.9}, {"nesterov", true}}};
constexpr std::int64_t kH = 2, kDelay = 1;

struct Plan {
  bool diloco = false;
  int victim = 2;
  std::int64_t lost_at = 2, join_at = 4, steps = 10;
  int n = 5;

  /// The ranks there at step t, ascending (= group rank order).
  std::vector<int> present(std::int64_t t) const {
    std::vector<int> out;
    for (int r = 0; r < n; ++r)
      if (r != victim || t < lost_at || t >= join_at) out.push_back(r);
    return out;
  }
  /// The step at which the survivors shrink: plsgd's next average after
  /// LOST_AT, diloco's sync after the failed prepare.
  std::int64_t shrinks_at() const {
    if (diloco) return lost_at + 1;
    std::int64_t t = lost_at;
    while (t < kWarmup || (t - kWarmup) % kPeriod != 0) ++t;
    return t;
  }
};

void set_rank_grads(const std::vector<Tensor>& params, int r, std::int64_t t) {
  for (std::size_t i = 0; i < params.size(); ++i) {
    Tensor g = Tensor::zeros({params[i].numel()});
    for (std::int64_t k = 0; k < params[i].numel(); ++k) g.data<float>()[k] = sref::grad_elem(r, t, i, k);
    params[i].set_grad(g);
  }
}

/// sum over the n group ranks of value(g) for element e of a flat float32
/// buffer of numel elements, in gloo's ring order (the first term as is).
template <class Value>
float ring_sum(std::int64_t e, std::int64_t numel, int n, const Value& value) {
  float acc = 0.0f;
  for (int j = 0; j < n; ++j) {
    const float v = value(dopt::ring_reference::contributor(e, numel, n, j));
    acc = j == 0 ? v : acc + v;
  }
  return acc;
}

/// Every rank of the reference, in this process: parameters and inner optimizer.
class RefRanks {
 public:
  RefRanks(const Plan& p, OptimizerSpec spec) : p_(p), spec_(std::move(spec)), params_(p.n), opts_(p.n) {
    for (int r = 0; r < p_.n; ++r) make(r, sref::make_params(kSizes));
  }

  /// Step t's local part (the newcomer first becomes rank 0's copy at
  /// JOIN_AT); returns the ranks there.
  std::vector<int> step(std::int64_t t) {
    if (t == p_.join_at) {
      std::vector<Tensor> copy;
      for (const auto& q : params_[0]) copy.push_back(q.clone());
      make(p_.victim, copy);
      opts_[static_cast<std::size_t>(p_.victim)]->load_state_dict(opts_[0]->state_dict());
    }
    const auto ranks = p_.present(t);
    for (int r : ranks) {
      set_rank_grads(params(r), r, t);
      opts_[static_cast<std::size_t>(r)]->step();
    }
    return ranks;
  }

  std::vector<Tensor>& params(int r) { return params_[static_cast<std::size_t>(r)]; }

 private:
  void make(int r, std::vector<Tensor> ps) {
    params_[static_cast<std::size_t>(r)] = std::move(ps);
    opts_[static_cast<std::size_t>(r)] = make_optimizer(spec_, {OptimizerParamGroup(params(r))});
  }

  Plan p_;
  OptimizerSpec spec_;
  std::vector<std::vector<Tensor>> params_;
  std::vector<std::unique_ptr<Optimizer>> opts_;
};

/// plsgd's average: sum_r (p_r / n) over `ranks`, all parameters as one flat buffer.
void ring_average(RefRanks& rs, const std::vector<int>& ranks) {
  std::int64_t total = 0;
  for (auto s : kSizes) total += s;
  const int n = static_cast<int>(ranks.size());
  std::int64_t base = 0;
  for (std::size_t i = 0; i < kSizes.size(); base += kSizes[i], ++i) {
    Tensor avg = Tensor::zeros({kSizes[i]});
    for (std::int64_t k = 0; k < kSizes[i]; ++k)
      avg.data<float>()[k] = ring_sum(base + k, total, n, [&](int g) {
        return rs.params(ranks[static_cast<std::size_t>(g)])[i].data<float>()[k] / static_cast<float>(n);
      });
    for (int r : ranks) rs.params(r)[i].copy_(avg);
  }
}

/// diloco's replicated part: the anchors, an outer SGD per fragment, the
/// average of the fragment prepared last.
struct RefOuter {
  std::vector<Tensor> anchors = sref::make_params(kSizes);
  std::vector<std::unique_ptr<Optimizer>> outer;
  std::size_t pending = 0;
  bool failed = false;
  std::vector<Tensor> average;

  RefOuter() {
    for (const auto& frag : kFragments) {
      std::vector<Tensor> mine;
      for (auto i : frag) mine.push_back(anchors[static_cast<std::size_t>(i)]);
      outer.push_back(make_optimizer(kOuter, {OptimizerParamGroup(mine)}));
    }
  }

  void prepare(std::size_t f, RefRanks& rs, const std::vector<int>& ranks) {
    pending = f;
    average.clear();
    std::int64_t total = 0;
    for (auto i : kFragments[f]) total += kSizes[static_cast<std::size_t>(i)];
    const int n = static_cast<int>(ranks.size());
    std::int64_t base = 0;
    for (auto i : kFragments[f]) {
      const auto ii = static_cast<std::size_t>(i);
      Tensor avg = Tensor::zeros({kSizes[ii]});
      for (std::int64_t e = 0; e < kSizes[ii]; ++e)
        avg.data<float>()[e] = ring_sum(base + e, total, n,
                                        [&](int g) {
                                          return anchors[ii].data<float>()[e] -
                                                 rs.params(ranks[static_cast<std::size_t>(g)])[ii].data<float>()[e];
                                        }) /
                               static_cast<float>(n);
      average.push_back(avg);
      base += kSizes[ii];
    }
  }

  void sync(RefRanks& rs, const std::vector<int>& ranks) {
    const auto& frag = kFragments[pending];
    if (!failed) {
      for (std::size_t j = 0; j < frag.size(); ++j) anchors[static_cast<std::size_t>(frag[j])].set_grad(average[j]);
      outer[pending]->step();
      for (auto i : frag) anchors[static_cast<std::size_t>(i)].set_grad(Tensor());
    }
    for (int r : ranks)  // the new anchors, or the old ones after a failed average
      for (auto i : frag) rs.params(r)[static_cast<std::size_t>(i)].copy_(anchors[static_cast<std::size_t>(i)]);
  }
};

/// Rank r's parameters at the end of the reference run.
std::vector<Tensor> reference(const Plan& p, int r) {
  RefRanks rs(p, p.diloco ? kInner : kAdam);
  RefOuter outer;
  for (std::int64_t t = 0; t < p.steps; ++t) {
    const auto ranks = rs.step(t);
    if (!p.diloco) {
      if (t >= kWarmup && (t - kWarmup) % kPeriod == 0) ring_average(rs, ranks);
      continue;
    }
    const std::int64_t l = t % kH + 1;
    if (l == kH - kDelay) {
      outer.failed = t == p.lost_at;
      outer.prepare(static_cast<std::size_t>((t / kH) % 2), rs, ranks);
    }
    if (l == kH) outer.sync(rs, ranks);
  }
  return rs.params(r);
}

std::unique_ptr<PostLocalSGDOptimizer> make_opt(const Plan& p, const std::vector<Tensor>& params,
                                                const ProcessGroup& g) {
  if (!p.diloco) {
    auto opt = std::make_unique<PostLocalSGDOptimizer>(make_optimizer(kAdam, {OptimizerParamGroup(params)}),
                                                       std::make_unique<PeriodicModelAverager>(kPeriod, kWarmup, g));
    opt->enable_survive();
    return opt;
  }
  DiLoCoOptions o;
  o.sync_every = kH * static_cast<std::int64_t>(kFragments.size());
  o.fragments = kFragments;
  o.fragment_sync_delay = kDelay;
  o.outer_optimizer = kOuter;
  return std::make_unique<PostLocalSGDOptimizer>(make_optimizer(kInner, {OptimizerParamGroup(params)}),
                                                 std::make_unique<DiLoCoAverager>(params, o, g));
}

long grow_scenario(ProcessGroup& world, int me, const Plan& p) {
  dopt::testing::Checker c{me};
  auto params = sref::make_params(kSizes);
  std::unique_ptr<PostLocalSGDOptimizer> opt;
  const bool newcomer = std::getenv("DOPT_REPLACES") != nullptr;
  if (newcomer) {
    for (auto& q : params) q.data<float>()[0] = -7.5f;  // overwritten by the catch-up
    auto joined = world.join_group();
    opt = make_opt(p, params, joined.group);
    post_local_sgd_catch_up(*opt, joined);
    c.expect(opt->averager().step() == p.join_at, "the newcomer caught up at step JOIN_AT");
  } else {
    opt = make_opt(p, params, world);
  }
  std::vector<std::int64_t> shrank;
  while (opt->averager().step() < p.steps) {
    const std::int64_t t = opt->averager().step();
    if (t == p.join_at && !newcomer) {
      ProcessGroup old = opt->averager().process_group();
      auto grown = old.grow();
      c.expect(grown.joined == std::vector<int>{p.victim}, "joined: the lost rank's replacement");
      post_local_sgd_catch_up(*opt, grown);
    }
    if (me == p.victim && t == p.lost_at && !newcomer) {
      // (Not at once: the others may not have seen the last step end yet.)
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      dopt::testing::die();
    }
    set_rank_grads(params, me, t);
    try {
      opt->step();
    } catch (const MembershipChangedError& e) {
      c.expect(!p.diloco && e.recovery().lost == std::vector<int>{p.victim}, "plsgd: the victim lost");
      shrank.push_back(t);
    } catch (const dopt::PeerLostError&) {
      if (!p.diloco) throw;
      // The failed fragment is back at its anchors: go on with the same
      // state over the shrunk group (docs/diloco.md).
      const StateDict sd = opt->state_dict();
      ProcessGroup old = opt->averager().process_group();
      opt = make_opt(p, params, old.shrink().group);
      opt->load_state_dict(sd);
      shrank.push_back(t);
    }
  }
  c.expect(shrank == (newcomer ? std::vector<std::int64_t>{} : std::vector<std::int64_t>{p.shrinks_at()}),
           "shrank once, at the step after the loss that averages");
  ProcessGroup g = opt->averager().process_group();
  c.expect(g.size() == p.n, "the grown group has every rank");
  c.params(params, reference(p, me), "parameters vs the reference run");
  g.barrier();
  return c.checks;
}

}  // namespace

int main(int argc, char** argv) {
  return dopt::testing::run_peer(
      [&](ProcessGroup& world, int rank) -> long {
        if (argc <= 5 || (std::string(argv[1]) != "plsgd" && std::string(argv[1]) != "diloco"))
          throw dopt::testing::Usage{"dopt_local_sgd_grow_peer plsgd|diloco VICTIM LOST_AT JOIN_AT STEPS"};
        Plan p;
        p.diloco = std::string(argv[1]) == "diloco";
        p.victim = std::stoi(argv[2]);
        p.lost_at = std::stoll(argv[3]);
        p.join_at = std::stoll(argv[4]);
        p.steps = std::stoll(argv[5]);
        p.n = std::atoi(std::getenv("WORLD_SIZE"));
        return grow_scenario(world, rank, p);
      },
      /*leave_together=*/false);
}
