#pragma once
// The common frame of the rank programs of the multi-process tests
// (tests/*_peer.cpp): join the world, run the scenario, report one line
// ("ok R CHECKS" or "error KIND: MESSAGE"), which processes.hpp reads on the
// test's side. A rank program's main() calls run_peer once, on its main
// thread; the scenario counts its checks in a Checker.
#include <signal.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <cstdio>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "dopt/actors/distributed.hpp"
#include "dopt/runtime/error.hpp"
#include "dopt/runtime/tensor.hpp"

namespace dopt::testing {

/// The dopt::Error subclass of e, by name.
inline const char* kind_of(const dopt::Error& e) {
  if (dynamic_cast<const dopt::TimeoutError*>(&e)) return "TimeoutError";
  if (dynamic_cast<const dopt::CollectiveMismatchError*>(&e)) return "CollectiveMismatchError";
  if (dynamic_cast<const dopt::PeerLostError*>(&e)) return "PeerLostError";
  if (dynamic_cast<const dopt::StateDictError*>(&e)) return "StateDictError";
  if (dynamic_cast<const dopt::StateError*>(&e)) return "StateError";
  if (dynamic_cast<const dopt::ValueError*>(&e)) return "ValueError";
  if (dynamic_cast<const dopt::IOError*>(&e)) return "IOError";
  if (dynamic_cast<const dopt::AuthenticationError*>(&e)) return "AuthenticationError";
  return "Error";
}

/// Counts checks and throws dopt::Error("check", what, rank) on the first that fails.
struct Checker {
  int rank;
  long checks = 0;
  void expect(bool ok, const std::string& what) {
    ++checks;
    if (!ok) throw dopt::Error("check", what, rank);
  }
  /// Same shape and dtype and the same bytes.
  void bitwise(const dopt::Tensor& got, const dopt::Tensor& want, const std::string& what) {
    expect(got.defined() && want.defined(), what + ": undefined tensor");
    expect(got.dtype() == want.dtype(), what + ": dtype differs");
    expect(got.shape() == want.shape(), what + ": shape " + dopt::shape_str(got.shape()) + " vs " +
                                            dopt::shape_str(want.shape()));
    const dopt::Tensor g = got.clone(), w = want.clone();  // contiguous own storage
    if (std::memcmp(g.data_ptr(), w.data_ptr(), g.nbytes()) != 0) {
      std::int64_t k = 0;
      if (g.dtype() == dopt::DType::float32)
        while (k < g.numel() && std::memcmp(g.data<float>() + k, w.data<float>() + k, 4) == 0) ++k;
      if (k >= g.numel()) k = 0;
      char buf[128];
      std::snprintf(buf, sizeof buf, ": bits differ (first at element %lld: %.9g vs %.9g)",
                    static_cast<long long>(k), g.at(k), w.at(k));
      expect(false, what + buf);
    }
  }
  void params(const std::vector<dopt::Tensor>& got, const std::vector<dopt::Tensor>& want, const std::string& what) {
    expect(got.size() == want.size(), what + ": parameter count");
    for (std::size_t i = 0; i < got.size(); ++i) bitwise(got[i], want[i], what + ", parameter " + std::to_string(i));
  }
};

/// The end of a rank that a scenario kills on purpose: stdout flushed, then
/// SIGKILL (no destructor, no goodbye to the peers).
[[noreturn]] inline void die() {
  std::fflush(stdout);
  ::raise(SIGKILL);
  for (;;) {
  }
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

}  // namespace dopt::testing
