// One rank of the growth tests between real processes
// (tests/replace_multiprocess.test.cpp), started by hand or by dopt-run:
//
//   dopt_grow_peer refused
//       every rank calls grow() on the world with no newcomer coming: on
//       the shm and actor planes (DOPT_TRANSPORT=tcp) it waits for one (a
//       2 s timeout here) and fails with TimeoutError; on the hierarchical
//       plane it is not implemented yet (NotSupportedError naming the call
//       and the plane); join_group() on a member's handle is a StateError.
//   dopt_grow_peer replaced VICTIM MARK
//       rank VICTIM kills itself (SIGKILL) after a barrier; the others shrink
//       the world and wait (up to 30 s) until the file MARK exists (written
//       once the lost rank's replacement has ended: it needs rank 0's
//       rendezvous port open), then all_reduce over the shrunk group.
//   dopt_grow_peer grown VICTIM WAIT_MS
//       rank VICTIM kills itself (SIGKILL) after a barrier; the others shrink
//       the world WAIT_MS later (1500: its replacement has connected by then;
//       0: grow() waits for it) and grow() it by one; the replacement (dopt-run
//       --on-failure replace) calls join_group(); all of them all_reduce
//       over the grown group (the sum of RANK + 1 over every rank), 8
//       floats and 1 MiB (actor plane: inline with the control messages, and
//       over the TCP mesh, which the members connected to the replacement's;
//       shm plane: the grown group's new regions, the replacement's among them).
//   dopt_grow_peer cycles VICTIM KILLS
//       rank VICTIM is lost KILLS times in a row: each of its incarnations
//       below KILLS (DOPT_INCARNATION; the first start is 0) kills itself
//       (SIGKILL) after the group it is in has done an all_reduce; each
//       replacement join_group()s; the others, after each loss, shrink,
//       grow and check the grown group as in `grown`, and go on; at the end
//       every rank checks an all_reduce over the last grown group.
//   dopt_grow_peer abandoned VICTIM [HOLD_MS]
//       rank VICTIM kills itself (SIGKILL) after a barrier; the others shrink
//       the world, ask newcomers_waiting() until its replacement waits (and
//       print "replacement waiting"), sleep HOLD_MS (default 0) and end
//       without growing; the replacement's join_group() (the handle's
//       timeout, DOPT_TIMEOUT_MS, is long) must fail with PeerLostError
//       naming the call, its rank and the job's end, within 10 s.
//   dopt_grow_peer elastic
//       an elastic world (DOPT_MIN_WORLD_SIZE = MIN of WORLD_SIZE): ranks
//       below MIN start it and check that the world group is them (size,
//       rank, an all_reduce); the others are newcomers of vacant slots
//       (DOPT_REPLACES, as dopt-run --nnodes MIN:MAX starts a later node's
//       ranks) and join_group(), then print "joined R". Every member asks
//       newcomers_waiting() in each round and grows by the one admitted (one
//       at a time), a newcomer takes part from the round after its join,
//       until the group has every rank (30 s at most); then all_reduce over
//       it, the sum of RANK + 1.
//
// Prints "ok R CHECKS" or "error KIND: MESSAGE" (tests/support/peer_main.hpp).
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
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
  const std::string plane = world.plane_stats().plane;
  const bool grows = plane == "actor" || plane == "shm";  // between processes
  const auto timeout = world.timeout();
  if (grows) world.set_timeout(std::chrono::seconds(2));
  try {
    world.grow();
  } catch (const dopt::NotSupportedError& e) {
    why = grows ? std::string() : e.what();
  } catch (const dopt::TimeoutError& e) {
    why = grows ? e.what() : std::string();
  }
  if (grows) {  // more than one newcomer per grow() between processes: refused at once
    std::string two;
    try {
      world.grow({.newcomers = 2});
    } catch (const dopt::NotSupportedError& e) {
      two = e.what();
    }
    c.expect(two.find("newcomers join one at a time") != std::string::npos, "grow(2): refused at once: " + two);
  }
  world.set_timeout(timeout);
  c.expect(why.find("ProcessGroup.grow") != std::string::npos, "grow: an error naming the call: " + why);
  if (grows) {
    c.expect(why.find("1 newcomer(s) expected, 0 came") != std::string::npos, "grow: no newcomer came: " + why);
    c.expect(why.find("the replacement of a lost rank") != std::string::npos, "grow: saying who comes: " + why);
  } else {
    c.expect(why.find("the " + plane + " plane") != std::string::npos, "grow: naming the " + plane + " plane: " + why);
    c.expect(why.find("not implemented yet") != std::string::npos, "grow: saying this plane cannot grow yet: " + why);
    c.expect(why.find("DOPT_TRANSPORT=tcp") != std::string::npos, "grow: saying what works instead: " + why);
  }
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

/// An all_reduce of 8 floats over `g` sums RANK + 1 over its `n` ranks.
void check_sum(dopt::testing::Checker& c, ProcessGroup& g, double n, int me, const std::string& what) {
  Tensor t = Tensor::full({8}, me + 1.0);
  g.all_reduce(t);
  c.expect(t.at(7) == n * (n + 1) / 2, what);
}

/// The grown group: `joined` joined it, it has every rank, and all_reduces
/// over it, small and 1 MiB, sum RANK + 1 over them.
void check_grown(dopt::testing::Checker& c, dopt::GrowResult& g, int joined, double n, int me) {
  c.expect(g.joined == std::vector<int>{joined}, "joined: the lost rank's replacement");
  c.expect(g.group.size() == n, "the grown group has every rank");
  check_sum(c, g.group, n, me, "all_reduce on the grown group");
  Tensor big = Tensor::full({1 << 18}, me + 1.0);
  g.group.all_reduce(big);
  bool summed = true;
  for (std::int64_t i = 0; i < (1 << 18); ++i) summed = summed && big.at(i) == n * (n + 1) / 2;
  c.expect(summed, "all_reduce of 1 MiB on the grown group (the TCP mesh, or the shm plane's new regions)");
  g.group.barrier();
}

long grown_scenario(ProcessGroup& world, int me, int victim, int wait_ms) {
  dopt::testing::Checker c{me};
  const double n = std::atoi(std::getenv("WORLD_SIZE"));
  if (std::getenv("DOPT_REPLACES")) {  // the replacement: a newcomer
    auto j = world.join_group();
    check_grown(c, j, me, n, me);
    return c.checks;
  }
  world.barrier();
  if (me == victim) {
    // (Not at once: on the actor plane the others may not have seen the
    // barrier end yet, and would lose it.)
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    dopt::testing::die();
  }
  c.expect(dopt::testing::carries_peer_lost(world.all_reduce_async(Tensor::full({8}, 1.0))),
           "the all_reduce fails with PeerLostError");
  // (Long enough, the replacement connects first: it waits for grow(), so
  // shrink() still sees the loss.)
  std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms));
  auto s = world.shrink();
  c.expect(s.lost == std::vector<int>{victim}, "the lost rank");
  auto g = s.group.grow();
  check_grown(c, g, victim, n, me);
  return c.checks;
}

long cycles_scenario(ProcessGroup& world, int me, int victim, int kills) {
  dopt::testing::Checker c{me};
  const double n = std::atoi(std::getenv("WORLD_SIZE"));
  const char* inc = std::getenv("DOPT_INCARNATION");
  const int incarnation = inc ? std::atoi(inc) : 0;
  ProcessGroup g = world;
  if (me == victim) {
    if (std::getenv("DOPT_REPLACES")) {
      auto j = world.join_group();
      check_grown(c, j, me, n, me);
      g = j.group;
    }
    if (incarnation < kills) {
      check_sum(c, g, n, me, "all_reduce before the loss");
      // (Not at once: the others may not have seen the all_reduce end yet.)
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      dopt::testing::die();
    }
  } else {
    for (int cycle = 0; cycle < kills; ++cycle) {
      check_sum(c, g, n, me, "all_reduce before loss " + std::to_string(cycle + 1));
      c.expect(dopt::testing::carries_peer_lost(g.all_reduce_async(Tensor::full({8}, 1.0))),
               "the all_reduce fails with PeerLostError");
      auto s = g.shrink();
      c.expect(s.lost == std::vector<int>{victim}, "the lost rank");
      auto grown = s.group.grow();
      check_grown(c, grown, victim, n, me);
      g = grown.group;
    }
  }
  check_sum(c, g, n, me, "all_reduce over the last grown group");
  g.barrier();
  return c.checks;
}

long abandoned_scenario(ProcessGroup& world, int me, int victim, int hold_ms) {
  dopt::testing::Checker c{me};
  if (std::getenv("DOPT_REPLACES")) {  // the replacement: nobody will grow a group to take it
    const auto t0 = std::chrono::steady_clock::now();
    std::string why;
    try {
      world.join_group();
    } catch (const dopt::PeerLostError& e) {
      why = e.what();
    }
    const auto waited = std::chrono::steady_clock::now() - t0;
    c.expect(!why.empty(), "join_group: PeerLostError");
    c.expect(why.find("ProcessGroup.join_group") != std::string::npos, "join_group: naming the call: " + why);
    c.expect(why.find("rank " + std::to_string(me)) != std::string::npos, "join_group: naming the rank: " + why);
    c.expect(why.find("the job ended: its rank 0 and every other member are gone") != std::string::npos,
             "join_group: saying the job ended: " + why);
    c.expect(waited < std::chrono::seconds(10), "join_group: failed within 10 s (its timeout is " +
                                                    std::to_string(world.timeout().count()) + " ms): " + why);
    return c.checks;
  }
  world.barrier();
  if (me == victim) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // (the others see the barrier end first)
    dopt::testing::die();
  }
  c.expect(dopt::testing::carries_peer_lost(world.all_reduce_async(Tensor::full({8}, 1.0))),
           "the all_reduce fails with PeerLostError");
  auto s = world.shrink();
  c.expect(s.lost == std::vector<int>{victim}, "the lost rank");
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  int waiting = 0;
  while ((waiting = s.group.newcomers_waiting()) == 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  c.expect(waiting == 1, "the replacement waits to join within 20 s");
  std::printf("replacement waiting\n");
  std::fflush(stdout);
  std::this_thread::sleep_for(std::chrono::milliseconds(hold_ms));
  return c.checks;  // and end without growing
}

long elastic_scenario(ProcessGroup& world, int me) {
  dopt::testing::Checker c{me};
  const int n = std::atoi(std::getenv("WORLD_SIZE"));
  const int min = std::atoi(std::getenv("DOPT_MIN_WORLD_SIZE"));
  ProcessGroup g = world;
  if (std::getenv("DOPT_REPLACES")) {
    auto j = world.join_group();
    c.expect(j.joined == std::vector<int>{me}, "the newcomer joined alone (one at a time)");
    g = j.group;
    std::printf("joined %d\n", me);  // (tests wait for it before they start the next newcomer)
    std::fflush(stdout);
  } else {
    c.expect(world.size() == min && world.rank() == me, "the world group is the ranks that started the job");
    check_sum(c, world, min, me, "all_reduce over the ranks present");
  }
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (g.size() < n && std::chrono::steady_clock::now() < until) {
    if (const int waiting = g.newcomers_waiting(); waiting > 0) {
      c.expect(waiting == 1, "one newcomer at a time");
      auto grown = g.grow({.newcomers = waiting});
      g = grown.group;
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  c.expect(g.size() == n, "the group has every rank");
  c.expect(g.rank() == me, "group ranks are world ranks");
  check_sum(c, g, n, me, "all_reduce over the full group");
  g.barrier();
  return c.checks;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  return dopt::testing::run_peer(
      [&](ProcessGroup& world, int rank) -> long {
        if (mode == "refused") return refused_scenario(world, rank);
        if (mode == "replaced" && argc > 3) return replaced_scenario(world, rank, std::stoi(argv[2]), argv[3]);
        if (mode == "grown" && argc > 3) return grown_scenario(world, rank, std::stoi(argv[2]), std::stoi(argv[3]));
        if (mode == "cycles" && argc > 3) return cycles_scenario(world, rank, std::stoi(argv[2]), std::stoi(argv[3]));
        if (mode == "abandoned" && argc > 2)
          return abandoned_scenario(world, rank, std::stoi(argv[2]), argc > 3 ? std::stoi(argv[3]) : 0);
        if (mode == "elastic") return elastic_scenario(world, rank);
        throw dopt::testing::Usage{
            "dopt_grow_peer refused | replaced VICTIM MARK | grown VICTIM WAIT_MS | cycles VICTIM KILLS | abandoned "
            "VICTIM [HOLD_MS] | elastic"};
      },
      /*leave_together=*/false);
}
