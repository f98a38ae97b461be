// One rank of the real-process ZeRO stage 3 test
// (tests/zero_stage3_multiprocess.test.cpp). Started by dopt-run; joins the
// world with dopt::init_process_group and runs, over the world group, each
// configuration twice in this process: stage 1 (ZeroRedundancyOptimizer with
// a Reducer) and stage 3 (ShardedUnits: gather with prefetch, reduce per
// unit, local step), then checks bitwise that stage 3 ends with stage 1's
// parameters (all of them, every rank) and consolidated optimizer state
// (rank 0, where stage 1 consolidates it), and that ShardedUnits::bytes()
// is 16/N B per parameter with Adam within 5%.
//
//   dopt_zero_stage3_peer parity     Adam, SGD with momentum, Adam with
//                              fp16_compress_hook; 3 steps, 4 units
//
// The gradients are arbitrary floats (not exact sums): the sums' order
// matters, so equal bits mean each shard's reduce added in the all_reduce's
// order. stdout: "ok R <checks>" on success, otherwise "error KIND: MESSAGE".
#include <string>
#include <utility>
#include <vector>

#include "dopt/optim/adam.hpp"
#include "dopt/optim/sgd.hpp"
#include "peer_main.hpp"
#include "zero_stage3_run.hpp"

namespace {

using namespace dopt;
using namespace dopt::optim;
using dopt::testing::Checker;
using dopt::testing::Stage3Run;

Stage3Run config(OptimizerSpec spec, bool fp16 = false) {
  Stage3Run run;
  run.spec = std::move(spec);
  run.shapes = {{37}, {5, 9}, {64}, {13}, {3, 11}, {100}, {7}, {20, 2}};
  run.unit_sizes = {3, 1, 2, 2};
  run.fp16 = fp16;
  return run;
}

void parity(ProcessGroup& world, Checker& c) {
  const std::vector<std::pair<std::string, Stage3Run>> configs{
      {"Adam", config(spec_of(AdamOptions(0.01)))},
      {"SGD-momentum", config(spec_of(SGDOptions(0.1).momentum(0.9)))},
      {"Adam-fp16", config(spec_of(AdamOptions(0.01)), true)},
  };
  for (const auto& [name, run] : configs) {
    const auto one = dopt::testing::run_stage1(world, run);
    const auto three = dopt::testing::run_stage3(world, run);
    c.params(three.params, one.params, name + " parameters");
    c.expect(three.peak_gathered <= 2 * three.largest_unit, name + ": more than two units gathered at once");
    if (world.rank() != 0) continue;
    c.expect(three.state.state.size() == one.state.state.size(), name + ": state entries");
    for (const auto& [idx, st] : one.state.state) {
      auto it = three.state.state.find(idx);
      c.expect(it != three.state.state.end() && it->second.size() == st.size(), name + ": state keys");
      for (const auto& [key, tensor] : st)
        c.bitwise(it->second.at(key), tensor, name + " state " + std::to_string(idx) + "." + key);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "parity";
  return dopt::testing::run_peer([&](ProcessGroup& world, int rank) {
    Checker c{rank};
    if (mode == "parity") parity(world, c);
    else throw dopt::testing::Usage{"dopt_zero_stage3_peer parity"};
    return c.checks;
  });
}
