// One rank of the real-process fault-tolerance tests
// (tests/survive_multiprocess.test.cpp). Started by hand or by dopt-run
// --on-failure continue; the lost rank kills itself with SIGKILL at the
// point the command line names, the others recover and go on:
//
//   dopt_survive_peer shrink VICTIM
//       after a barrier VICTIM dies; the others' all_reduce fails with
//       PeerLostError, they shrink the world and check collectives on the new
//       group (a small and a staged all_reduce, a broadcast).
//   dopt_survive_peer zero KILL [KILL]     KILL = RANK:STEP:POINT[:INDEX]
//       ZeroRedundancyOptimizer(Adam), redundancy 1, 5 steps; RANK dies at
//       step STEP at POINT ("between" steps, before its gradient all_reduce;
//       "begin" of step(); "computed" after its local step; "broadcast" after
//       posting broadcast INDEX; with host_memory on one host, before copying
//       the INDEX-th other owner's parameters out of its segment, after the
//       first barrier). The survivors' final parameters must equal,
//       bit for bit, a plain Adam stepped with the gradients of the members
//       that contributed to each step (the reference run of
//       distributed/src/zero/zero_survive_reference.hpp, as the simulated tests).
//   dopt_survive_peer zero-host-memory KILL [KILL]
//       the same with ZeroBuddyUpdate::host_memory (bucket view, chunks of
//       1000 elements); POINT may also be "chunk" (after writing chunk INDEX
//       of a parameter, before committing it) or "timer" (a thread raises
//       SIGKILL INDEX microseconds after the "begin" of step STEP: anywhere
//       in the local step, down to the middle of a kernel; if the step gets
//       to "computed" first, the rank waits there to die).
//
// stdout: "ok R <checks>" on success, "error KIND: MESSAGE" otherwise.
#include <signal.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "dopt/actors/distributed.hpp"
#include "dopt/optim/registry.hpp"
#include "dopt/distributed/zero.hpp"
#include "peer_main.hpp"
#include "zero/zero_survive_reference.hpp"

namespace {

using dopt::ProcessGroup;
using dopt::Tensor;
using namespace dopt::optim;

using dopt::testing::die;

using dopt::optim::survive_reference::Kill;

// 70001 and 300000 elements take the shared-memory plane's staged path.
const std::vector<std::int64_t> kSizes = {257, 64, 3000, 33, 5, 300000, 1, 70001, 12};
constexpr std::int64_t kSteps = 5;

std::vector<Tensor> make_params() { return dopt::optim::survive_reference::make_params(kSizes); }

OptimizerSpec spec() { return OptimizerSpec{"Adam", {{"lr", 0.01}, {"weight_decay", 0.1}}}; }

Kill parse_kill(const std::string& s) {
  Kill k;
  std::vector<std::string> parts;
  std::size_t a = 0;
  for (;;) {
    auto b = s.find(':', a);
    parts.push_back(s.substr(a, b - a));
    if (b == std::string::npos) break;
    a = b + 1;
  }
  if (parts.size() < 3) throw dopt::testing::Usage{"KILL is RANK:STEP:POINT[:INDEX]"};
  k.rank = std::stoi(parts[0]);
  k.step = std::stoll(parts[1]);
  k.point = parts[2];
  if (parts.size() > 3) k.index = std::stoi(parts[3]);
  return k;
}

/// The reference run (distributed/src/zero/zero_survive_reference.hpp).
std::vector<Tensor> reference(int n, const std::vector<Kill>& kills) {
  return dopt::optim::survive_reference::reference_params(kSizes, spec(), n, kills, kSteps);
}

long zero_scenario(ProcessGroup& start, int me, const std::vector<Kill>& kills, bool host_memory) {
  dopt::testing::Checker c{me};
  auto dies = [&](std::int64_t step, const std::string& point, int index) {
    for (const auto& k : kills)
      if (k.rank == me && k.step == step && k.point == point &&
          ((point != "broadcast" && point != "chunk") || k.index == index))
        return true;
    return false;
  };
  auto timer = [&](std::int64_t step) -> int {  // microseconds, -1: none
    for (const auto& k : kills)
      if (k.rank == me && k.step == step && k.point == "timer") return k.index;
    return -1;
  };
  ProcessGroup world = start;
  auto params = make_params();
  ZeroOptions zo{world};
  zo.redundancy = 1;
  if (host_memory) {
    zo.buddy_update = ZeroBuddyUpdate::host_memory;
    zo.parameters_as_bucket_view = true;
    zo.host_memory_chunk = 1000;
  }
  zo.probe = [&](const char* point, std::int64_t step, int index) {
    if (dies(step, point, index)) die();
    const int us = timer(step);
    if (us >= 0 && std::string(point) == "begin")
      std::thread([us] {
        std::this_thread::sleep_for(std::chrono::microseconds(us));
        die();
      }).detach();
    if (us >= 0 && std::string(point) == "computed")
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));  // the timer's SIGKILL comes
  };
  ZeroRedundancyOptimizer zero(params, spec(), zo);
  // Processes on one host: host_memory reads the parameters from the segments.
  c.expect(zero.reads_parameters_from_segments() == host_memory, "parameters read from the segments");
  int recoveries = 0;
  while (zero.step_count() < kSteps) {
    const std::int64_t t = zero.step_count();
    try {
      if (dies(t, "between", 0)) die();
      survive_reference::set_mean_grads(params, world, me, t);
      zero.step();
    } catch (const MembershipChangedError& e) {
      world = e.recovery().group;
      c.expect(e.recovery().step_completed, "the step in flight was completed");
      ++recoveries;
    } catch (const dopt::PeerLostError&) {
      auto r = zero.recover();
      world = r.group;
      c.expect(!r.step_completed, "recover() takes no step");
      ++recoveries;
    }
  }
  c.expect(recoveries == static_cast<int>(kills.size()), "one recovery per loss");
  c.expect(zero.reads_parameters_from_segments() == (host_memory && world.size() > 1),
           "parameters read from the segments after the recoveries");
  c.expect(world.size() == start.size() - static_cast<int>(kills.size()), "the survivors' group");
  c.params(params, reference(start.size(), kills), "parameters after recovery vs the reference run");
  world.barrier();
  return c.checks;
}

long shrink_scenario(ProcessGroup& world, int me, int victim) {
  dopt::testing::Checker c{me};
  world.barrier();
  if (me == victim) die();
  bool lost = false;
  try {
    Tensor t = Tensor::full({16}, 1.0);
    world.all_reduce(t);
  } catch (const dopt::PeerLostError&) {
    lost = true;
  }
  c.expect(lost, "the all_reduce fails with PeerLostError");
  auto s = world.shrink();
  c.expect(s.group.size() == world.size() - 1, "one rank less");
  c.expect(s.lost == std::vector<int>{victim}, "the lost rank");
  const std::string plane = world.plane_stats().plane;  // hier: the shrunk group runs on the actor plane
  c.expect(s.group.plane_stats().plane == (plane == "hier" ? std::string("actor") : plane), "the shrunk group's plane");
  double want = 0;
  for (int r : s.group.ranks()) want += r + 1;
  for (std::int64_t n : {std::int64_t{7}, std::int64_t{3000000}}) {
    Tensor t = Tensor::full({n}, me + 1.0);
    s.group.all_reduce(t);
    c.expect(t.at(0) == want && t.at(n - 1) == want, "all_reduce on the new group");
  }
  Tensor b = Tensor::full({1000000}, s.group.rank() == 0 ? 7.0 : 0.0);
  s.group.broadcast(b, 0);
  c.expect(b.at(999999) == 7.0, "broadcast on the new group");
  s.group.barrier();
  return c.checks;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  return dopt::testing::run_peer(
      [&](ProcessGroup& world, int rank) -> long {
        if (mode == "shrink" && argc > 2) return shrink_scenario(world, rank, std::stoi(argv[2]));
        if ((mode == "zero" || mode == "zero-host-memory") && argc > 2) {
          std::vector<Kill> kills;
          for (int a = 2; a < argc; ++a) kills.push_back(parse_kill(argv[a]));
          return zero_scenario(world, rank, kills, mode == "zero-host-memory");
        }
        throw dopt::testing::Usage{"dopt_survive_peer shrink VICTIM | zero[-host-memory] RANK:STEP:POINT[:INDEX] ..."};
      },
      /*leave_together=*/false);
}
