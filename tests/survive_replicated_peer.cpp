// One rank of the real-process tests of PostLocalSGDOptimizer and the Reducer
// surviving a lost rank (tests/survive_multiprocess.test.cpp, "replicated"
// cases). Started by hand or by dopt-run --on-failure continue:
//
//   dopt_survive_replicated_peer plsgd|reducer VICTIM:STEP:POINT [callback]
//       the scenario of distributed/src/survive/survive_replicated_scenarios.hpp at the
//       world's size; VICTIM kills itself (SIGKILL) at STEP, POINT "before",
//       "during" (part of its collectives posted) or "after" (300 ms after it
//       finished the step, when the others have too). Each survivor then runs
//       the reference run (simulated ranks in this process, the same
//       membership change applied at the same step without a crash) and
//       compares its parameters bit for bit.
//
// stdout: "ok R <checks>" on success, "error KIND: MESSAGE" otherwise.
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "dopt/actors/distributed.hpp"
#include "peer_main.hpp"
#include "survive/survive_replicated_scenarios.hpp"

namespace {

using dopt::ProcessGroup;
using namespace dopt::survive_test;

using dopt::testing::die;

long scenario(ProcessGroup& world, int me, const std::string& mode, const std::string& kill, bool callback) {
  dopt::testing::Checker c{me};
  Scenario sc;
  sc.n = world.size();
  sc.callback = callback;
  const auto a = kill.find(':'), b = kill.rfind(':');
  if (a == std::string::npos || a == b) throw dopt::testing::Usage{"KILL is VICTIM:STEP:POINT"};
  sc.victim = std::stoi(kill.substr(0, a));
  sc.step = std::stoll(kill.substr(a + 1, b - a - 1));
  sc.point = kill.substr(b + 1);
  Hooks h;
  h.die = [] { die(); };
  h.wait_all = [] { std::this_thread::sleep_for(std::chrono::milliseconds(300)); };
  RankResult got;
  std::vector<RankResult> ref;
  if (mode == "plsgd") {
    sc.change_at = plsgd_change_at(sc);
    got = plsgd_rank(world, me, sc, h);
    ref = plsgd_reference(sc);
  } else {
    sc.steps = 5;
    sc.change_at = sc.point == "after" ? sc.step + 1 : sc.step;
    got = reducer_rank(world, me, sc, h);
    ref = reducer_reference(sc);
  }
  const RankResult& want = ref[static_cast<std::size_t>(me)];
  c.expect(got.done && want.done, "both runs finished");
  c.expect(got.final_size == sc.n - 1, "the survivors' group has one rank less");
  c.expect(got.log.find("lost=" + std::to_string(sc.victim)) != std::string::npos, "one recovery, naming the lost rank: " + got.log);
  c.expect(got.params.size() == want.params.size(), "parameter count");
  for (std::size_t i = 0; i < want.params.size(); ++i)
    c.expect(got.params[i] == want.params[i], "parameter " + std::to_string(i) + " bitwise the reference run's");
  return c.checks;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  const bool callback = argc > 3 && std::string(argv[3]) == "callback";
  return dopt::testing::run_peer(
      [&](ProcessGroup& world, int rank) -> long {
        if ((mode == "plsgd" || mode == "reducer") && argc > 2) return scenario(world, rank, mode, argv[2], callback);
        throw dopt::testing::Usage{"dopt_survive_replicated_peer plsgd|reducer VICTIM:STEP:POINT [callback]"};
      },
      /*leave_together=*/false);
}
