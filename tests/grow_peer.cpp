// One rank of the growth tests between real processes
// (tests/replace_multiprocess.test.cpp), started by hand or by dopt-run:
//
//   dopt_grow_peer refused
//       every rank calls grow() on the world: between processes it is not
//       implemented yet, so each gets NotSupportedError naming the call and
//       the world's plane; join_group() on a member's handle is a StateError.
//   dopt_grow_peer replaced VICTIM MARK
//       rank VICTIM kills itself (SIGKILL) after a barrier; the others shrink
//       the world and wait (up to 30 s) until the file MARK exists (written
//       once the lost rank's replacement has ended: it needs rank 0's
//       rendezvous port open), then all_reduce over the shrunk group.
//
// Prints "ok R CHECKS" or "error KIND: MESSAGE" (tests/support/peer_main.hpp).
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include "lost_rank.hpp"
#include "peer_main.hpp"

namespace {

using dopt::ProcessGroup;
using dopt::Tensor;

long refused_scenario(ProcessGroup& world, int me) {
  dopt::testing::Checker c{me};
  world.barrier();
  std::string why;
  try {
    world.grow();
  } catch (const dopt::NotSupportedError& e) {
    why = e.what();
  }
  const std::string plane = world.plane_stats().plane;
  c.expect(why.find("ProcessGroup.grow") != std::string::npos, "grow: NotSupportedError naming the call: " + why);
  c.expect(why.find("the " + plane + " plane") != std::string::npos, "grow: naming the " + plane + " plane: " + why);
  c.expect(why.find("between processes") != std::string::npos, "grow: saying processes cannot grow yet: " + why);
  bool member = false;
  try {
    world.join_group();
  } catch (const dopt::StateError& e) {
    member = std::string(e.what()).find("already a member") != std::string::npos;
  }
  c.expect(member, "join_group on a member's handle: StateError");
  Tensor t = Tensor::full({8}, me + 1.0);
  world.all_reduce(t);  // the world goes on after the refusals
  const double n = world.size();
  c.expect(t.at(7) == n * (n + 1) / 2, "all_reduce on the world after the refusals");
  world.barrier();
  return c.checks;
}

long replaced_scenario(ProcessGroup& world, int me, int victim, const std::string& mark) {
  dopt::testing::Checker c{me};
  world.barrier();
  if (me == victim) dopt::testing::die();
  c.expect(dopt::testing::carries_peer_lost(world.all_reduce_async(Tensor::full({8}, 1.0))),
           "the all_reduce fails with PeerLostError");
  auto s = world.shrink();
  c.expect(s.lost == std::vector<int>{victim}, "the lost rank");
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (::access(mark.c_str(), F_OK) != 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  c.expect(::access(mark.c_str(), F_OK) == 0, "the replacement ended within 30 s");
  Tensor t = Tensor::full({8}, me + 1.0);
  s.group.all_reduce(t);
  double want = 0;
  for (int r : s.group.ranks()) want += r + 1;
  c.expect(t.at(7) == want, "all_reduce on the shrunk group");
  s.group.barrier();
  return c.checks;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  return dopt::testing::run_peer([&](ProcessGroup& world, int rank) -> long {
    if (mode == "refused") return refused_scenario(world, rank);
    if (mode == "replaced" && argc > 3) return replaced_scenario(world, rank, std::stoi(argv[2]), argv[3]);
    throw dopt::testing::Usage{"dopt_grow_peer refused | replaced VICTIM MARK"};
  }, /*leave_together=*/false);
}
