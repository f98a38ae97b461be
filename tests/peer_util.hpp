#pragma once
// The common frame of the rank programs of the multi-process tests
// (tests/*_peer.cpp): join the world, run the scenario, report one line.
#include <chrono>
#include <cstdio>
#include <exception>
#include <functional>
#include <string>

#include "dopt/actors/distributed.hpp"
#include "dopt/runtime/error.hpp"

namespace dopt_test {

/// The dopt::Error subclass of e, by name.
inline const char* kind_of(const dopt::Error& e) {
  if (dynamic_cast<const dopt::TimeoutError*>(&e)) return "TimeoutError";
  if (dynamic_cast<const dopt::CollectiveMismatchError*>(&e)) return "CollectiveMismatchError";
  if (dynamic_cast<const dopt::PeerLostError*>(&e)) return "PeerLostError";
  if (dynamic_cast<const dopt::StateDictError*>(&e)) return "StateDictError";
  if (dynamic_cast<const dopt::StateError*>(&e)) return "StateError";
  if (dynamic_cast<const dopt::ValueError*>(&e)) return "ValueError";
  if (dynamic_cast<const dopt::IOError*>(&e)) return "IOError";
  return "Error";
}

/// Thrown by a scenario for a bad command line: run_peer prints it and returns 2.
struct Usage {
  std::string text;
};

/// Joins the world described by the environment (init_process_group, 20 s
/// rendezvous, 2 CAF threads), runs body(world, rank), which returns how many
/// checks it made, and prints "ok R CHECKS" — after a final barrier when
/// leave_together, so that no rank exits while a peer is still in its last
/// collective. On failure it prints "error KIND: MESSAGE" and
/// "elapsed_ms N". Returns the exit status: 0, 1 (error) or 2 (usage).
inline int run_peer(const std::function<long(dopt::ProcessGroup&, int)>& body, bool leave_together = true) {
  const auto t0 = std::chrono::steady_clock::now();
  auto report = [&](const char* kind, const char* what) {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
    std::printf("error %s: %s\nelapsed_ms %lld\n", kind, what, static_cast<long long>(ms.count()));
    std::fflush(stdout);
    return 1;
  };
  try {
    auto env = dopt::launch_env_from_environment();
    if (!env) return report("Error", "not launched (no RANK / WORLD_SIZE)");
    dopt::RuntimeOptions opts = dopt::RuntimeOptions::from_env();
    opts.threads = 2;
    dopt::Runtime rt(opts);
    dopt::InitOptions init;
    init.timeout = std::chrono::seconds(20);
    dopt::ProcessGroup world = dopt::init_process_group(rt, *env, init);
    const long checks = body(world, env->rank);
    if (leave_together) world.barrier();
    std::printf("ok %d %ld\n", env->rank, checks);
    std::fflush(stdout);
    return 0;
  } catch (const Usage& u) {
    std::printf("error Error: usage: %s\n", u.text.c_str());
    std::fflush(stdout);
    return 2;
  } catch (const dopt::Error& e) {
    return report(kind_of(e), e.what());
  } catch (const std::exception& e) {
    return report("std::exception", e.what());
  }
}

}  // namespace dopt_test
