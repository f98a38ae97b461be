// Recovery at scale (issue 46): 1,024 deterministic simulated ranks train a
// ZeroRedundancyOptimizer with redundancy = 1; a fault plan crashes 8 of them
// at once, at the first gradient all_reduce of a step, none of them the
// buddy of another (one host: rank r's buddy is r + 1). The survivors
// recover and finish bit for bit like the reference of
// zero_survive_reference.hpp: the lost ranks' gradients are left out from
// that step on. Hidden tag ([.]): the sim-scale CTest runs it
// (tests/sim_scale.cmake), not the unit run or the swarm.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "dopt/actors/simulate.hpp"
#include "dopt/distributed/zero.hpp"
#include "dopt/optim/registry.hpp"
#include "zero_survive_reference.hpp"

using namespace dopt;
using namespace dopt::optim;

namespace {

constexpr int kRanks = 1024;
constexpr std::int64_t kSteps = 3;
constexpr std::int64_t kLossStep = 1;
// Owners of the heaviest parameters (0 .. 11 own one each) and others; no two
// are neighbours, so every lost shard has a surviving buddy.
const std::vector<int> kLost = {1, 3, 6, 10, 300, 511, 777, 1022};
const std::vector<std::int64_t> kSizes = {257, 64, 300, 33, 5, 100, 1, 700, 12, 40, 9, 128};
const OptimizerSpec kSpec{"Adam", {{"lr", 0.01}, {"weight_decay", 0.1}}};
// A rank's calls: the constructor's agreements, then per step one gradient
// all_reduce per parameter and ZeRO's step (checked below through the
// name of the call the plan crashed in).
constexpr int kCtorCalls = 2;
constexpr int kStepCalls = 12 + 13;

struct Survivor {
  bool finished = false;
  std::vector<std::vector<int>> members;  // per step: whose gradients it averaged
  std::vector<std::vector<float>> params;
  std::string log;
};

/// Each parameter's bits, one after the other (a bitwise comparison).
std::vector<std::uint32_t> bits(const std::vector<std::vector<float>>& params) {
  std::vector<std::uint32_t> out;
  for (const auto& p : params) {
    const std::size_t at = out.size();
    out.resize(at + p.size());
    std::memcpy(out.data() + at, p.data(), p.size() * sizeof(float));
  }
  return out;
}

/// The run, with its report and its real time in seconds.
std::vector<Survivor> run(SimReport& report, double& seconds) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<Survivor> out(static_cast<std::size_t>(kRanks));
  SimulateOptions so;
  so.deterministic = true;
  so.seed = 46;
  so.report = &report;
  for (int r : kLost) so.faults.crash(r, kCtorCalls + static_cast<int>(kLossStep) * kStepCalls + 1);
  simulate(kRanks, [&](RankContext& ctx) {
    const int me = ctx.rank();
    Survivor s;
    ProcessGroup world = ctx.world();
    auto params = survive_reference::make_params(kSizes);
    ZeroOptions zo{world};
    zo.redundancy = 1;
    ZeroRedundancyOptimizer zero(params, kSpec, zo);
    while (zero.step_count() < kSteps) {
      const std::int64_t t = zero.step_count();
      const std::vector<int> members = world.ranks();
      try {
        survive_reference::set_mean_grads(params, world, me, t);
        zero.step();
        s.members.push_back(members);
      } catch (const MembershipChangedError& e) {
        world = e.recovery().group;
        s.members.push_back(members);
        s.log += "changed at step " + std::to_string(e.recovery().step) + ";";
      } catch (const PeerLostError&) {
        const auto rec = zero.recover();
        world = rec.group;
        s.log += "recovered " + std::to_string(rec.lost.size()) + " lost at step " + std::to_string(rec.step) + ";";
      }
    }
    s.finished = true;
    for (const auto& p : params) s.params.push_back(p.to_vector<float>());
    out[static_cast<std::size_t>(me)] = std::move(s);
  }, so);
  seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace

TEST_CASE("ZeRO redundancy at scale: 1024 simulated ranks lose 8 at once, the survivors finish bitwise the reference",
          "[.][sim-scale]") {
  SimReport report;
  double seconds = 0;
  const auto res = run(report, seconds);
  WARN(kRanks << " ranks, " << kSteps << " steps, 8 lost: " << seconds << " s real, "
              << static_cast<double>(report.virtual_time.count()) / 1e6 << " ms virtual, " << report.decisions
              << " scheduling points; " << (report.faults.empty() ? std::string() : report.faults.front()) << "; rank 0: "
              << res[0].log);
  REQUIRE(report.fired.crashes == kLost.size());
  for (const auto& f : report.faults) {
    INFO(f);
    CHECK(f.find("all_reduce") != std::string::npos);  // the first gradient all_reduce of step kLossStep
  }

  std::vector<survive_reference::Kill> kills;
  for (int r : kLost) kills.push_back({r, kLossStep, "between", 0});
  const auto members = survive_reference::members_per_step(kRanks, kills, kSteps);
  std::vector<std::vector<float>> ref;
  for (const auto& p : survive_reference::reference_params(kSizes, kSpec, kRanks, kills, kSteps))
    ref.push_back(p.to_vector<float>());
  const auto ref_bits = bits(ref);
  int survivors = 0;
  for (int r = 0; r < kRanks; ++r) {
    if (std::find(kLost.begin(), kLost.end(), r) != kLost.end()) continue;
    const auto& s = res[static_cast<std::size_t>(r)];
    INFO("rank " << r << ": " << s.log);
    REQUIRE(s.finished);
    REQUIRE(s.members == members);
    REQUIRE(bits(s.params) == ref_bits);  // every parameter, bit for bit
    ++survivors;
  }
  CHECK(survivors == kRanks - static_cast<int>(kLost.size()));
}
