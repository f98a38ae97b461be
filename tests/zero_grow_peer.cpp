// One rank of the ZeRO growing-back test between real processes
// (tests/replace_multiprocess.test.cpp), started by dopt-run --on-failure
// replace on the actor plane (DOPT_TRANSPORT=tcp) or on the shm plane:
//
//   dopt_zero_grow_peer VICTIM LOST_AT JOIN_AT STEPS [bucket_view | checkpoint DIR]
//       the ranks train a ZeroRedundancyOptimizer (Adam, redundancy 1) over
//       the gradients of survive_reference::grad_elem, averaged over the
//       current group each step; rank VICTIM kills itself (SIGKILL) before
//       step LOST_AT's gradients; the others catch PeerLostError and
//       recover() (its shard comes back from the buddy copy), train over the
//       shrunk group, and before step JOIN_AT grow() it by one: each makes a
//       ZeRO over the grown group and zero_catch_up()s from the old one.
//       VICTIM's replacement (DOPT_REPLACES) join_group()s, makes its ZeRO
//       and catches up (state, parameters, step count: sent by the members).
//       All train to step STEPS; every rank compares its parameters bitwise
//       with the reference below. bucket_view: parameters_as_bucket_view.
//       checkpoint DIR: redundancy 0 (a lost shard has no copy): every rank
//       save_sharded()s to DIR/step-T-of-N at each step boundary T (N: the
//       group's size); after the loss the survivors shrink() the group,
//       build a ZeRO over it and load_sharded() the checkpoint of step
//       LOST_AT (written by all 5 ranks just before the victim died; the
//       parameters are those of that boundary, as step LOST_AT never ran),
//       then go on as above.
//
// The reference: a plain Adam (same spec) over make_params, stepped at step t
// with the mean of grad_elem(r, t, ...) over the ranks r that contributed:
// every rank, except VICTIM at LOST_AT <= t < JOIN_AT (the newcomer takes
// VICTIM's rank). The sums are exact in float32 (zero_survive_reference.hpp),
// and ZeRO runs the same kernels, so the bits match.
//
// Prints "ok R CHECKS" or "error KIND: MESSAGE" (tests/support/peer_main.hpp).
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "dopt/distributed/zero.hpp"
#include "dopt/optim/registry.hpp"
#include "peer_main.hpp"
#include "zero/zero_survive_reference.hpp"

namespace {

using dopt::ProcessGroup;
using dopt::Tensor;
using namespace dopt::optim;
namespace ref = dopt::optim::survive_reference;

const std::vector<std::int64_t> kSizes = {257, 64, 3000, 33, 5, 300, 1, 7001, 12};

OptimizerSpec spec() { return OptimizerSpec{"Adam", {{"lr", 0.01}, {"weight_decay", 0.1}}}; }

struct Plan {
  int victim = 2;
  std::int64_t lost_at = 2, join_at = 4, steps = 7;
  int n = 5;
  bool bucket_view = false;
  std::string checkpoint;  // non-empty: redundancy 0, sharded checkpoints in this folder
};

/// The reference run's parameters after p.steps steps.
std::vector<Tensor> reference(const Plan& p) {
  auto ps = ref::make_params(kSizes);
  std::vector<OptimizerParamGroup> groups;
  groups.emplace_back(ps);
  auto adam = make_optimizer(spec(), std::move(groups));
  for (std::int64_t t = 0; t < p.steps; ++t) {
    const bool shrunk = t >= p.lost_at && t < p.join_at;
    const float count = static_cast<float>(shrunk ? p.n - 1 : p.n);
    for (std::size_t i = 0; i < ps.size(); ++i) {
      Tensor mean = Tensor::zeros({kSizes[i]});
      float* d = mean.data<float>();
      for (int r = 0; r < p.n; ++r) {
        if (shrunk && r == p.victim) continue;  // lost, and not replaced yet
        for (std::int64_t k = 0; k < kSizes[i]; ++k) d[k] += ref::grad_elem(r, t, i, k);
      }
      for (std::int64_t k = 0; k < kSizes[i]; ++k) d[k] /= count;
      ps[i].set_grad(mean);
    }
    adam->step();
  }
  return ps;
}

/// Where the ranks of a group of `size` save their shards at step boundary t.
std::string checkpoint_dir(const Plan& p, std::int64_t t, int size) {
  return p.checkpoint + "/step-" + std::to_string(t) + "-of-" + std::to_string(size);
}

ZeroOptions options_over(const ProcessGroup& g, const Plan& p) {
  ZeroOptions zo{g};
  zo.redundancy = p.checkpoint.empty() ? 1 : 0;
  zo.parameters_as_bucket_view = p.bucket_view;
  // A member's parameters are views of its old optimizer's buckets when it
  // makes the new one; the tensors here are the parameters themselves.
  if (p.bucket_view) zo.rebind_parameter = [](const Tensor&) {};
  return zo;
}

long zero_grow_scenario(ProcessGroup& world, int me, const Plan& p) {
  dopt::testing::Checker c{me};
  auto params = ref::make_params(kSizes);
  ProcessGroup g = world;
  std::unique_ptr<ZeroRedundancyOptimizer> zero;
  const bool newcomer = std::getenv("DOPT_REPLACES") != nullptr;
  if (newcomer) {
    for (auto& q : params) q.data<float>()[0] = 1e6f;  // what it holds does not matter: it is sent
    auto joined = world.join_group();
    g = joined.group;
    zero = std::make_unique<ZeroRedundancyOptimizer>(params, spec(), options_over(g, p));
    zero_catch_up(*zero, nullptr, joined);
    c.expect(zero->step_count() == p.join_at, "the newcomer caught up at step JOIN_AT");
  } else {
    zero = std::make_unique<ZeroRedundancyOptimizer>(params, spec(), options_over(g, p));
  }
  int recoveries = 0;
  while (zero->step_count() < p.steps) {
    const std::int64_t t = zero->step_count();
    if (t == p.join_at && g.size() < p.n) {
      auto grown = g.grow();
      c.expect(grown.joined == std::vector<int>{p.victim}, "joined: the lost rank's replacement");
      auto bigger = std::make_unique<ZeroRedundancyOptimizer>(params, spec(), options_over(grown.group, p));
      zero_catch_up(*bigger, zero.get(), grown);
      zero = std::move(bigger);
      g = grown.group;
    }
    if (!p.checkpoint.empty()) zero->save_sharded(checkpoint_dir(p, t, g.size()));
    try {
      if (me == p.victim && t == p.lost_at && !newcomer) {
        // (Not at once: the others may not have seen the last step end yet.)
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        dopt::testing::die();
      }
      ref::set_mean_grads(params, g, me, t);
      zero->step();
    } catch (const dopt::PeerLostError&) {
      if (!p.checkpoint.empty()) {
        // No copy of the victim's shard: the last checkpoint, over the survivors.
        auto shrunk = g.shrink();
        c.expect(t == p.lost_at && shrunk.lost == std::vector<int>{p.victim}, "the victim lost at step LOST_AT");
        g = shrunk.group;
        zero.reset();
        zero = std::make_unique<ZeroRedundancyOptimizer>(params, spec(), options_over(g, p));
        const auto report = zero->load_sharded(checkpoint_dir(p, t, p.n));
        c.expect(report.saved_world_size == p.n && zero->step_count() == t, "the checkpoint of step LOST_AT loaded");
        ++recoveries;
        continue;
      }
      auto r = zero->recover();
      c.expect(t == p.lost_at && r.lost == std::vector<int>{p.victim}, "the victim lost at step LOST_AT");
      g = r.group;
      ++recoveries;
    }
  }
  c.expect(recoveries == (newcomer ? 0 : 1), "one recovery on a member, none on the newcomer");
  c.expect(g.size() == p.n, "the grown group has every rank");
  c.params(params, reference(p), "parameters vs the reference run");
  g.barrier();
  return c.checks;
}

}  // namespace

int main(int argc, char** argv) {
  return dopt::testing::run_peer(
      [&](ProcessGroup& world, int rank) -> long {
        if (argc <= 4)
          throw dopt::testing::Usage{"dopt_zero_grow_peer VICTIM LOST_AT JOIN_AT STEPS [bucket_view | checkpoint DIR]"};
        Plan p;
        p.victim = std::stoi(argv[1]);
        p.lost_at = std::stoll(argv[2]);
        p.join_at = std::stoll(argv[3]);
        p.steps = std::stoll(argv[4]);
        p.bucket_view = argc > 5 && std::string(argv[5]) == "bucket_view";
        if (argc > 6 && std::string(argv[5]) == "checkpoint") p.checkpoint = argv[6];
        p.n = std::atoi(std::getenv("WORLD_SIZE"));
        return zero_grow_scenario(world, rank, p);
      },
      /*leave_together=*/false);
}
