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
//     MODE hierarchical: PostLocalSGDOptimizer (Adam, HierarchicalModelAverager
//       {2: 1, 3: n} over n ranks, warm-up 1: each rank alone at even steps,
//       the whole group at multiples of 3), without enable_survive: every
//       step starts with a barrier of the averager's group, where the
//       survivors see the loss at LOST_AT and rebuild their optimizer over
//       the shrunk group with the same state; the grown group's averager
//       rebuilds its levels (take_grown_group).
//     MODE diloco-other-h: diloco, but the replacement builds sync_every 8
//       (the members 4): every process's catch-up raises ValueError.
//     Before step JOIN_AT the survivors grow() the averager's group by one and
//     post_local_sgd_catch_up(); VICTIM's replacement (DOPT_REPLACES)
//     join_group()s, builds its optimizer over the grown group and catches
//     up (parameters and state of group rank 0). All train to step STEPS and
//     compare their parameters bitwise with the reference below.
//
// The reference, computed by every process for this rank, is the simulated
// tests' (distributed/src/local_sgd/grow_reference.hpp): each rank's own
// inner optimizer on its own gradients (survive_reference::grad_elem, rank
// r's at step t); the ranks there at step t are all but VICTIM at LOST_AT <= t
// < JOIN_AT; at JOIN_AT, VICTIM (the newcomer takes its rank, and so its
// place in the grown group) becomes a copy of rank 0's parameters and inner
// optimizer state. The averages are over the ranks there, in group rank order
// (ascending), added in gloo's ring order: for plsgd (periodic_reference)
// sum_r (p_r / n) over all parameters; for diloco (diloco_reference) the
// deltas anchor - p_r over the fragment's parameters, summed, then / n,
// applied by the fragment's outer SGD at the sync (alpha 0: every rank takes
// the anchors).
//
// Prints "ok R CHECKS" or "error KIND: MESSAGE" (tests/support/peer_main.hpp).
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "dopt/distributed/averagers.hpp"
#include "dopt/distributed/diloco.hpp"
#include "dopt/distributed/post_local_sgd.hpp"
#include "dopt/optim/registry.hpp"
#include "local_sgd/grow_reference.hpp"
#include "peer_main.hpp"

namespace {

using dopt::ProcessGroup;
using dopt::StateDict;
using dopt::Tensor;
using namespace dopt::optim;
using dopt::grow_test::diloco_reference;
using dopt::grow_test::hierarchical_reference;
using dopt::grow_test::periodic_reference;
using dopt::grow_test::set_rank_grads;
using Who = dopt::grow_test::Plan;
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

/// hierarchical: the HierarchicalModelAverager's map over a group of n ranks.
std::map<std::int64_t, int> levels(int n) { return {{2, 1}, {3, n}}; }

struct Plan {
  bool diloco = false;
  bool hierarchical = false;
  bool other_h = false;  // diloco-other-h
  int victim = 2;
  std::int64_t lost_at = 2, join_at = 4, steps = 10;
  int n = 5;

  /// The step at which the survivors shrink: plsgd's next average after
  /// LOST_AT, diloco's sync after the failed prepare.
  std::int64_t shrinks_at() const {
    if (hierarchical) return lost_at;
    if (diloco) return lost_at + 1;
    std::int64_t t = lost_at;
    while (t < kWarmup || (t - kWarmup) % kPeriod != 0) ++t;
    return t;
  }
};

/// Rank r's parameters at the end of the reference run (grow_reference.hpp):
/// the victim is there until LOST_AT, its replacement (the same rank) from JOIN_AT on.
std::vector<Tensor> reference(const Plan& p, int r) {
  const Who who{p.victim, p.lost_at, /*newcomer=*/p.victim, p.join_at, /*newcomers=*/1, /*world=*/p.n};
  auto rs = p.diloco         ? diloco_reference(who, kSizes, kFragments, kInner, kOuter, kH, kDelay, p.steps)
            : p.hierarchical ? hierarchical_reference(who, kSizes, kAdam, kWarmup, levels, p.steps)
                             : periodic_reference(who, kSizes, kAdam, kWarmup, kPeriod, p.steps);
  return rs.params(r);
}

std::unique_ptr<PostLocalSGDOptimizer> make_opt(const Plan& p, const std::vector<Tensor>& params,
                                                const ProcessGroup& g, bool newcomer = false) {
  if (p.hierarchical)
    return std::make_unique<PostLocalSGDOptimizer>(
        make_optimizer(kAdam, {OptimizerParamGroup(params)}),
        std::make_unique<HierarchicalModelAverager>(levels(g.size()), kWarmup, g));
  if (!p.diloco) {
    auto opt = std::make_unique<PostLocalSGDOptimizer>(make_optimizer(kAdam, {OptimizerParamGroup(params)}),
                                                       std::make_unique<PeriodicModelAverager>(kPeriod, kWarmup, g));
    opt->enable_survive();
    return opt;
  }
  DiLoCoOptions o;
  o.sync_every = kH * static_cast<std::int64_t>(kFragments.size()) * (newcomer && p.other_h ? 2 : 1);
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
    opt = make_opt(p, params, joined.group, true);
    post_local_sgd_catch_up(*opt, joined);
    c.expect(opt->averager().step() == p.join_at, "the newcomer caught up at step JOIN_AT");
  } else {
    opt = make_opt(p, params, world);
  }
  std::vector<std::int64_t> shrank;
  // Go on with the same state over the shrunk group (docs/diloco.md).
  auto rebuild = [&](std::int64_t t) {
    const StateDict sd = opt->state_dict();
    ProcessGroup old = opt->averager().process_group();
    opt = make_opt(p, params, old.shrink().group);
    opt->load_state_dict(sd);
    shrank.push_back(t);
  };
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
    if (p.hierarchical) {
      // No enable_survive: the survivors see the loss at a barrier, before
      // an average changed anything.
      try {
        ProcessGroup g = opt->averager().process_group();
        g.barrier();
      } catch (const dopt::PeerLostError&) {
        rebuild(t);
      }
    }
    set_rank_grads(params, me, t);
    try {
      opt->step();
    } catch (const MembershipChangedError& e) {
      c.expect(!p.diloco && e.recovery().lost == std::vector<int>{p.victim}, "plsgd: the victim lost");
      shrank.push_back(t);
    } catch (const dopt::PeerLostError&) {
      if (!p.diloco) throw;
      rebuild(t);  // the failed fragment is back at its anchors
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
        const std::string mode = argc > 5 ? argv[1] : "";
        if (mode != "plsgd" && mode != "diloco" && mode != "hierarchical" && mode != "diloco-other-h")
          throw dopt::testing::Usage{
              "dopt_local_sgd_grow_peer plsgd|diloco|hierarchical|diloco-other-h VICTIM LOST_AT JOIN_AT STEPS"};
        Plan p;
        p.diloco = mode == "diloco" || mode == "diloco-other-h";
        p.other_h = mode == "diloco-other-h";
        p.hierarchical = mode == "hierarchical";
        p.victim = std::stoi(argv[2]);
        p.lost_at = std::stoll(argv[3]);
        p.join_at = std::stoll(argv[4]);
        p.steps = std::stoll(argv[5]);
        p.n = std::atoi(std::getenv("WORLD_SIZE"));
        return grow_scenario(world, rank, p);
      },
      /*leave_together=*/false);
}
