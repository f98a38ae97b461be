// DiLoCo: every rank takes inner steps on its own data; every `sync_every`
// steps the ranks average their pseudo-gradients (anchor - parameters) and an
// outer Nesterov SGD steps the shared anchor. Here Streaming DiLoCo: two
// fragments on staggered schedules, each average overlapping one further
// inner step, sent as int8 with error feedback.
// Each rank minimises (w - target_r)^2 with its own target; the global
// optimum is the mean target, which the anchor approaches.
//
//   dopt-example-diloco   (or: dopt-run --nproc-per-node 3 dopt-example-diloco)
#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include "dopt/actors/distributed.hpp"
#include "dopt/distributed/diloco.hpp"
#include "dopt/distributed/post_local_sgd.hpp"
#include "dopt/optim/sgd.hpp"

using dopt::Tensor;
using namespace dopt::optim;

namespace {

void train(dopt::RankContext& ctx) {
  const int rank = ctx.rank(), n = ctx.world_size();
  std::vector<Tensor> params{Tensor::zeros({4}), Tensor::zeros({3})};

  DiLoCoOptions o;
  o.sync_every = 8;                   // each fragment every 8 inner steps
  o.fragments = {{0}, {1}};           // staggered: one of them every 4 steps
  o.fragment_sync_delay = 1;          // its average overlaps 1 inner step
  o.wire_format = WireFormat::int8;   // 1 byte per value plus a scale per row
  o.error_feedback = true;
  o.outer_optimizer = {"SGD", {{"lr", 0.7}, {"momentum", 0.5}, {"nesterov", true}}};
  auto inner = std::make_unique<SGD>(params, SGDOptions(0.05));
  auto diloco = std::make_unique<DiLoCoAverager>(params, o, ctx.world());
  const DiLoCoAverager& averager = *diloco;
  PostLocalSGDOptimizer opt(std::move(inner), std::move(diloco));

  const float target = static_cast<float>(rank);  // this rank's "data"
  const float optimum = static_cast<float>(n - 1) / 2;
  for (int step = 0; step < 96; ++step) {
    for (const Tensor& p : params) {
      std::vector<float> g(static_cast<std::size_t>(p.numel()));
      for (std::size_t i = 0; i < g.size(); ++i) g[i] = 2 * (p.data<float>()[i] - target);
      p.set_grad(Tensor::from_vector(g));
    }
    opt.step();
    opt.zero_grad(true);
    if (rank == 0 && (step + 1) % 16 == 0)
      std::printf("step %2d  anchors %.4f %.4f (optimum %.1f), %lld syncs, %llu bytes sent\n", step + 1,
                  averager.anchors()[0].data<float>()[0], averager.anchors()[1].data<float>()[0], optimum,
                  static_cast<long long>(averager.stats().syncs),
                  static_cast<unsigned long long>(averager.stats().bytes_sent));
  }
  for (const Tensor& a : averager.anchors())
    if (std::fabs(a.data<float>()[0] - optimum) > 0.1f)
      throw dopt::ValueError("example", "the anchor did not approach the optimum", rank);
}

}  // namespace

int main() {
  try {
    dopt::RunOptions options;
    options.simulated_ranks = 3;
    dopt::run_distributed(train, options);
  } catch (const dopt::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
