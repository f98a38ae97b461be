// ZeRO (ZeroRedundancyOptimizer): each rank keeps the optimizer state of its
// shard of the parameters only. Four simulated ranks fit a linear model; the
// gradients are averaged by the DDP-style Reducer, ZeRO(Adam) steps each
// rank's shard and broadcasts it. Then the state is saved as one shard per
// rank and loaded back at another world size (3 ranks).
//
//   dopt-example-zero            (or: dopt-run --nproc-per-node 4 dopt-example-zero)
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "dopt/actors/distributed.hpp"
#include "dopt/distributed/reducer.hpp"
#include "dopt/distributed/zero.hpp"

using dopt::Tensor;
namespace fs = std::filesystem;
using namespace dopt::optim;

namespace {

// The model: y = W x + b with W [8, 16], b [8], and two extra layers' worth of
// parameters so that every rank owns something.
std::vector<Tensor> make_params() {
  return {Tensor::full({8, 16}, 0.1), Tensor::zeros({8}), Tensor::full({16, 16}, 0.05), Tensor::zeros({16})};
}

// A made-up gradient that differs per rank (each rank's "data").
void set_local_grads(const std::vector<Tensor>& params, int rank, int step) {
  for (std::size_t i = 0; i < params.size(); ++i)
    params[i].set_grad(Tensor::full(params[i].shape(), 0.01 * (rank + 1) * (i + 1) + 0.001 * step));
}

void train(dopt::RankContext& ctx, const fs::path& dir) {
  const int rank = ctx.rank();
  std::vector<Tensor> params = make_params();
  Reducer reducer(params, ctx.world());  // averages gradients over the ranks
  ZeroRedundancyOptimizer zero(params, OptimizerSpec{"Adam", {{"lr", 1e-2}}}, ZeroOptions{ctx.world()});

  for (int step = 0; step < 5; ++step) {
    set_local_grads(params, rank, step);
    for (std::size_t i = params.size(); i-- > 0;) reducer.mark_ready(params[i]);  // last layer first
    reducer.finalize();  // every grad = the average over the ranks
    zero.step();         // Adam on this rank's shard, then broadcasts from the owners
  }

  // Who owns what, and how much state each rank holds (printed in rank order).
  const std::vector<int> owners = zero.param_owners();
  std::string line = "rank " + std::to_string(rank) + " owns parameter(s)";
  for (std::size_t i = 0; i < owners.size(); ++i)
    if (owners[i] == rank) line += " " + std::to_string(i) + " (" + std::to_string(params[i].numel()) + " elements)";
  line += " and holds " + std::to_string(zero.local_state_bytes()) + " bytes of Adam state";
  for (int r = 0; r < ctx.world_size(); ++r) {
    if (r == rank) std::printf("%s\n", line.c_str()), std::fflush(stdout);
    ctx.world().barrier();
  }

  if (rank == 0) fs::remove_all(dir);  // an earlier run's shards
  ctx.world().barrier();
  zero.save_sharded(dir.string());  // collective: one file per rank
  if (rank == 0) std::printf("saved %d shards to %s\n", ctx.world_size(), dir.string().c_str());
}

void resume_at_3(dopt::RankContext& ctx, const fs::path& dir) {
  std::vector<Tensor> params = make_params();
  ZeroRedundancyOptimizer zero(params, OptimizerSpec{"Adam", {{"lr", 1e-2}}}, ZeroOptions{ctx.world()});
  const ShardLoadReport report = zero.load_sharded(dir.string());  // any world size
  std::string line = "rank " + std::to_string(ctx.rank()) + " of 3 read shard(s)";
  for (int r : report.shards_read) line += " " + std::to_string(r);
  line += " of the " + std::to_string(report.saved_world_size) + " saved: " + std::to_string(report.tensors_read) +
          " state tensors, step count " + std::to_string(zero.step_count());
  for (int r = 0; r < ctx.world_size(); ++r) {
    if (r == ctx.rank()) std::printf("%s\n", line.c_str()), std::fflush(stdout);
    ctx.world().barrier();
  }
}

}  // namespace

int main() {
  try {
    // One folder per run (all processes of one dopt-run share its port).
    const auto env = dopt::launch_env_from_environment();
    const fs::path dir = fs::temp_directory_path() /
                         ("dopt-example-zero-" + std::to_string(env ? env->master_port : ::getpid()));
    dopt::RunOptions options;
    options.simulated_ranks = 4;
    dopt::run_distributed([&](dopt::RankContext& ctx) { train(ctx, dir); }, options);
    if (!env) {  // resharding demo: simulated only
      dopt::simulate(3, [&](dopt::RankContext& ctx) { resume_at_3(ctx, dir); });
      fs::remove_all(dir);
    } else if (env->rank == 0) {
      fs::remove_all(dir);  // save_sharded ended with a barrier: every rank is done with it
    }
  } catch (const dopt::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
