// One rank of the real-process ZeRO stage 2 test
// (tests/zero_stage2_multiprocess.test.cpp). Started by dopt-run; joins the
// world with dopt::init_process_group and runs, over the world group, each
// configuration twice in this process: stage 1 (ZeroRedundancyOptimizer with
// a plain Reducer) and stage 2 (the Reducer with zero_stage2_options), then
// checks bitwise that stage 2 ends with stage 1's parameters (all of them),
// optimizer state and owned gradients, that it holds no other gradient, and
// that Reducer::gradient_bytes() is the owned gradients' bytes.
//
//   dopt_zero_stage2_peer parity     Adam, SGD with momentum, Adam with
//                                    fp16_compress_hook, Muon with the
//                                    step_cost partition; 3 steps, small
//                                    buckets, 2 micro-batches (one no_sync)
//
// The gradients are arbitrary floats (not exact sums): the sums' order matters,
// so equal bits mean the reduce onto the owners added in the all_reduce's order.
// stdout: "ok R <checks>" on success, otherwise "error KIND: MESSAGE".
#include <optional>
#include <string>
#include <vector>

#include "dopt/actors/distributed.hpp"
#include "dopt/distributed/comm_hooks.hpp"
#include "dopt/distributed/reducer.hpp"
#include "dopt/distributed/zero.hpp"
#include "dopt/optim/adam.hpp"
#include "dopt/optim/muon.hpp"
#include "dopt/optim/sgd.hpp"
#include "peer_main.hpp"
#include "reference_data.hpp"

namespace {

using namespace dopt;
using namespace dopt::optim;
using dopt::testing::Checker;

struct Config {
  std::string name;
  OptimizerSpec spec;
  std::vector<Shape> shapes;
  ZeroPartitionWeight weight = ZeroPartitionWeight::element_count;
  bool fp16 = false;
};

struct Outcome {
  std::vector<Tensor> params, grads;  // grads: owned only (undefined elsewhere)
  StateDict state;
  int foreign_grads = 0;
  std::int64_t gradient_bytes = 0, owned_bytes = 0;
};

Outcome train(ProcessGroup& world, const Config& c, bool stage2) {
  const int rank = world.rank();
  std::vector<Tensor> ps;
  for (std::size_t i = 0; i < c.shapes.size(); ++i)
    ps.push_back(Tensor::from_vector(
        dopt::testing::values<float>(static_cast<std::size_t>(shape_numel(c.shapes[i])), 60 + i), c.shapes[i]));
  ZeroOptions zo;
  zo.process_group = world;
  zo.partition_weight = c.weight;
  ZeroRedundancyOptimizer zero(ps, c.spec, zo);
  const ReducerOptions ro{.bucket_cap_bytes = 256, .first_bucket_cap_bytes = 96};
  Reducer red(ps, world, stage2 ? zero_stage2_options(zero, ps, ro) : ro);
  if (c.fp16) red.register_comm_hook(fp16_compress_hook(world));
  Outcome o;
  for (int t = 0; t < 3; ++t) {
    zero.zero_grad(true);
    for (int j = 0; j < 2; ++j) {
      std::optional<Reducer::NoSync> guard;
      if (j == 0) guard.emplace(red.no_sync());
      for (std::size_t k = ps.size(); k-- > 0;) {
        const auto n = static_cast<std::size_t>(shape_numel(c.shapes[k]));
        Tensor g = Tensor::from_vector(dopt::testing::values<float>(n, 5000 + 1000 * k + 131 * rank + 17 * t + j, 3.0),
                                       c.shapes[k]);
        if (ps[k].grad().defined()) {
          float* acc = ps[k].grad().data<float>();
          for (std::int64_t e = 0; e < g.numel(); ++e) acc[e] += g.data<float>()[e];
        } else {
          ps[k].set_grad(g);
        }
        red.mark_ready(ps[k]);
      }
      red.finalize();
    }
    o.gradient_bytes = red.gradient_bytes();
    zero.step();
  }
  const auto owners = zero.param_owners();
  for (std::size_t k = 0; k < ps.size(); ++k) {
    o.params.push_back(ps[k]);
    if (owners[k] == rank) {
      o.grads.push_back(ps[k].grad());
      o.owned_bytes += static_cast<std::int64_t>(ps[k].nbytes());
    } else if (ps[k].grad().defined()) {
      ++o.foreign_grads;
    }
  }
  o.state = zero.optim().state_dict();
  return o;
}

void parity(ProcessGroup& world, Checker& c) {
  const std::vector<Shape> vectors{{37}, {5, 9}, {64}, {13}, {3, 11}, {100}, {7}, {20, 2}};
  const std::vector<Config> configs{
      {"Adam", spec_of(AdamOptions(0.01)), vectors},
      {"SGD-momentum", spec_of(SGDOptions(0.1).momentum(0.9)), vectors},
      {"Adam-fp16", spec_of(AdamOptions(0.01)), vectors, ZeroPartitionWeight::element_count, true},
      {"Muon", spec_of(MuonOptions()), {{8, 12}, {12, 8}, {4, 4}, {6, 10}, {16, 4}}, ZeroPartitionWeight::step_cost},
  };
  for (const auto& cfg : configs) {
    const Outcome one = train(world, cfg, false);
    const Outcome two = train(world, cfg, true);
    c.params(two.params, one.params, cfg.name + " parameters");
    c.expect(two.grads.size() == one.grads.size(), cfg.name + ": owned gradient count");
    for (std::size_t i = 0; i < two.grads.size(); ++i)
      c.bitwise(two.grads[i], one.grads[i], cfg.name + " owned gradient " + std::to_string(i));
    c.expect(two.foreign_grads == 0, cfg.name + ": stage 2 holds gradients of parameters it does not own");
    c.expect(two.gradient_bytes == two.owned_bytes, cfg.name + ": stage 2 gradient_bytes is not the owned bytes");
    c.expect(two.state.state.size() == one.state.state.size(), cfg.name + ": state entries");
    for (const auto& [idx, st] : one.state.state) {
      auto it = two.state.state.find(idx);
      c.expect(it != two.state.state.end() && it->second.size() == st.size(), cfg.name + ": state keys");
      for (const auto& [key, tensor] : st)
        c.bitwise(it->second.at(key), tensor, cfg.name + " state " + std::to_string(idx) + "." + key);
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
