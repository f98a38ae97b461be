// Helper process for tests/rendezvous.test.cpp: joins the rendezvous
// described by its environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT),
// prints what it saw and runs a few more barriers.
//   usage: dopt_rendezvous_peer TIMEOUT_MS [HOLD_MS]
// HOLD_MS: stay up that long after "done" (rank 0 keeps its port open).
// stdout: "self R NAME", then "table R r NAME" for every rank r, then "done R";
// on failure "error KIND: MESSAGE" (KIND: TimeoutError, ValueError, IOError,
// PeerLostError, StateError, Error) and exit status 1.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "dopt/actors/rendezvous.hpp"
#include "dopt/actors/runtime.hpp"
#include "dopt/runtime/error.hpp"
#include "dopt/runtime/launch_env.hpp"
#include "peer_main.hpp"

using dopt::testing::kind_of;

int main(int argc, char** argv) {
  const long timeout_ms = argc > 1 ? std::strtol(argv[1], nullptr, 10) : 20000;
  try {
    auto env = dopt::launch_env_from_environment();
    if (!env) {
      std::printf("error Error: not launched (no RANK / WORLD_SIZE)\n");
      return 1;
    }
    dopt::RuntimeOptions opts;
    opts.threads = 2;
    dopt::Runtime rt(opts);
    auto rdv = dopt::rendezvous(rt, *env, {.timeout = std::chrono::milliseconds(timeout_ms)});
    const int me = rdv.rank();
    std::printf("self %d %s\n", me, rdv.peer(me).c_str());
    for (int r = 0; r < rdv.world_size(); ++r) std::printf("table %d %d %s\n", me, r, rdv.peer(r).c_str());
    std::fflush(stdout);
    for (int i = 0; i < 3; ++i) rdv.barrier(std::chrono::milliseconds(timeout_ms));
    std::printf("done %d\n", me);
    std::fflush(stdout);
    if (argc > 2) std::this_thread::sleep_for(std::chrono::milliseconds(std::strtol(argv[2], nullptr, 10)));
    return 0;
  } catch (const dopt::Error& e) {
    std::printf("error %s: %s\n", kind_of(e), e.what());
  } catch (const std::exception& e) {
    std::printf("error std::exception: %s\n", e.what());
  }
  std::fflush(stdout);
  return 1;
}
