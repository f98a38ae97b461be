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
//                              fp16_compress_hook, and Adam and SGD with
//                              momentum writing gradient_buffers (reduced
//                              in place, sync and async), and both writing
//                              into the gathered memory
//                              (release_for_gradients; two unit buffers at
//                              most); 3 steps, 4 units
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

Stage3Run config(OptimizerSpec spec, bool fp16 = false, bool in_place = false, bool async = false,
                 bool from_gathered = false) {
  Stage3Run run;
  run.spec = std::move(spec);
  run.shapes = {{37}, {5, 9}, {64}, {13}, {3, 11}, {100}, {7}, {20, 2}};
  run.unit_sizes = {3, 1, 2, 2};
  run.fp16 = fp16;
  run.in_place = in_place;
  run.async = async;
  run.from_gathered = from_gathered;
  return run;
}

void parity(ProcessGroup& world, Checker& c) {
  const std::vector<std::pair<std::string, Stage3Run>> configs{
      {"Adam", config(spec_of(AdamOptions(0.01)))},
      {"SGD-momentum", config(spec_of(SGDOptions(0.1).momentum(0.9)))},
      {"Adam-fp16", config(spec_of(AdamOptions(0.01)), true)},
      {"Adam-in-place", config(spec_of(AdamOptions(0.01)), false, /*in_place=*/true)},
      {"SGD-momentum-in-place-async",
       config(spec_of(SGDOptions(0.1).momentum(0.9)), false, /*in_place=*/true, /*async=*/true)},
      {"Adam-from-gathered", config(spec_of(AdamOptions(0.01)), false, true, false, /*from_gathered=*/true)},
      {"SGD-momentum-from-gathered-async",
       config(spec_of(SGDOptions(0.1).momentum(0.9)), false, true, /*async=*/true, /*from_gathered=*/true)},
  };
  for (const auto& [name, run] : configs) {
    const auto one = dopt::testing::run_stage1(world, run);
    const auto three = dopt::testing::run_stage3(world, run);
    c.params(three.params, one.params, name + " parameters");
    c.expect(three.peak_gathered <= 2 * three.largest_unit, name + ": more than two units gathered at once");
    if (run.from_gathered)
      c.expect(three.peak_buffers <= 2 * three.largest_unit, name + ": more than two unit buffers at once");
    if (world.rank() != 0) continue;
    const auto want = dopt::testing::named_state(one.state), got = dopt::testing::named_state(three.state);
    c.expect(!want.empty() && got.size() == want.size(), name + ": state tensors");
    for (std::size_t i = 0; i < got.size() && i < want.size(); ++i) {
      c.expect(got[i].first == want[i].first, name + ": state " + got[i].first + " where stage 1 has " + want[i].first);
      c.bitwise(got[i].second, want[i].second, name + " state " + want[i].first);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const bool known = argc < 2 || std::string(argv[1]) == "parity";  // the only mode
  return dopt::testing::run_peer([&](ProcessGroup& world, int rank) {
    if (!known) throw dopt::testing::Usage{"dopt_zero_stage3_peer parity"};
    Checker c{rank};
    parity(world, c);
    return c.checks;
  });
}
