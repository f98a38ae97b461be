// One rank of the real-process ZeRO stage 2 test
// (tests/zero_stage2_multiprocess.test.cpp). Started by dopt-run; joins the
// world with dopt::init_process_group and runs, over the world group, each
// configuration twice in this process: stage 1 (ZeroRedundancyOptimizer with
// a plain Reducer) and stage 2 (the Reducer with zero_stage2_options), then
// checks bitwise that stage 2 ends with stage 1's parameters (all of them),
// optimizer state and owned gradients, that it holds no other gradient, and
// that Reducer::gradient_bytes() is the owned gradients' bytes and at most one bucket.
//
//   dopt_zero_stage2_peer parity     Adam, SGD with momentum, Adam with
//                                    fp16_compress_hook, Muon with the
//                                    step_cost partition; 3 steps, small
//                                    buckets, 2 micro-batches (one no_sync)
//
// The gradients are arbitrary floats (not exact sums): the sums' order matters,
// so equal bits mean the reduce onto the owners added in the all_reduce's order.
// stdout: "ok R <checks>" on success, otherwise "error KIND: MESSAGE".
#include <string>
#include <utility>
#include <vector>

#include "dopt/optim/adam.hpp"
#include "dopt/optim/muon.hpp"
#include "dopt/optim/sgd.hpp"
#include "peer_main.hpp"
#include "zero_stage2_run.hpp"

namespace {

using namespace dopt;
using namespace dopt::optim;
using dopt::testing::Checker;
using dopt::testing::Stage2Run;

Stage2Run config(OptimizerSpec spec, std::vector<Shape> shapes, bool fp16 = false,
                 ZeroPartitionWeight weight = ZeroPartitionWeight::element_count) {
  Stage2Run run;
  run.spec = std::move(spec);
  run.shapes = std::move(shapes);
  run.fp16 = fp16;
  run.weight = weight;
  run.micro = 2;
  run.bucket_cap_bytes = 256;
  run.first_bucket_cap_bytes = 96;
  return run;
}

void parity(ProcessGroup& world, Checker& c) {
  const std::vector<Shape> vectors{{37}, {5, 9}, {64}, {13}, {3, 11}, {100}, {7}, {20, 2}};
  const std::vector<std::pair<std::string, Stage2Run>> configs{
      {"Adam", config(spec_of(AdamOptions(0.01)), vectors)},
      {"SGD-momentum", config(spec_of(SGDOptions(0.1).momentum(0.9)), vectors)},
      {"Adam-fp16", config(spec_of(AdamOptions(0.01)), vectors, true)},
      {"Muon", config(spec_of(MuonOptions()), {{8, 12}, {12, 8}, {4, 4}, {6, 10}, {16, 4}}, false,
                      ZeroPartitionWeight::step_cost)},
  };
  for (const auto& [name, run] : configs) {
    const auto one = dopt::testing::run_stage(world, run, false);
    const auto two = dopt::testing::run_stage(world, run, true);
    c.params(two.params, one.params, name + " parameters");
    c.expect(two.grads.size() == one.grads.size(), name + ": owned gradient count");
    for (std::size_t i = 0; i < two.grads.size(); ++i)
      c.bitwise(two.grads[i], one.grads[i], name + " owned gradient " + std::to_string(i));
    c.expect(two.foreign_grads == 0, name + ": stage 2 holds gradients of parameters it does not own");
    c.expect(two.gradient_bytes >= two.owned_bytes && two.gradient_bytes <= two.owned_bytes + two.largest_bucket,
             name + ": stage 2 gradient_bytes is not the owned bytes and at most one bucket");
    c.expect(two.state.state.size() == one.state.state.size(), name + ": state entries");
    for (const auto& [idx, st] : one.state.state) {
      auto it = two.state.state.find(idx);
      c.expect(it != two.state.state.end() && it->second.size() == st.size(), name + ": state keys");
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
    else throw dopt::testing::Usage{"dopt_zero_stage2_peer parity"};
    return c.checks;
  });
}
