#pragma once
// Processes for the multi-process tests in tests/: start a program as a child
// process with its environment set, wait for it, read what it printed; start
// a rank program (tests/*_peer.cpp) as n ranks, through dopt-run or by hand,
// and require that every rank printed "ok R CHECKS"; check a run in which
// some ranks were killed. Called from the test thread (they REQUIRE); each
// call waits for the processes it started.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "ports.hpp"
#include "temp_dir.hpp"
#include "text.hpp"

namespace dopt::testing {

struct Proc {
  pid_t pid = -1;
  std::string out_path;
};

struct Done {
  int status = -1;
  std::string out;
  int pid = 0;
  bool ok() const { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }
  bool failed() const { return WIFEXITED(status) && WEXITSTATUS(status) == 1; }
};

// Starts argv with the environment overrides (empty value: unset); stdout and
// stderr go to one file.
inline Proc start(std::vector<std::string> argv, const std::map<std::string, std::string>& env) {
  static int counter = 0;  // one per test binary: names stay unique
  Proc p;
  p.out_path = "/tmp/dopt_rdv_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++);
  std::vector<char*> args;
  for (std::string& s : argv) args.push_back(s.data());
  args.push_back(nullptr);
  p.pid = ::fork();
  REQUIRE(p.pid >= 0);
  if (p.pid == 0) {
    for (const char* v : {"LOCAL_RANK", "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                          "SLURM_PROCID", "SLURM_NTASKS", "SLURM_NPROCS"})
      ::unsetenv(v);
    for (const auto& [k, v] : env) {
      if (v.empty()) ::unsetenv(k.c_str());
      else ::setenv(k.c_str(), v.c_str(), 1);
    }
    const int o = ::open(p.out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ::dup2(o, STDOUT_FILENO);
    ::dup2(o, STDERR_FILENO);
    ::execv(args[0], args.data());
    ::_exit(126);
  }
  return p;
}

inline Done wait(const Proc& p) {
  Done d;
  REQUIRE(::waitpid(p.pid, &d.status, 0) == p.pid);
  d.out = slurp(p.out_path);
  ::unlink(p.out_path.c_str());
  return d;
}

inline std::map<std::string, std::string> rank_env(int rank, int world, int port) {
  return {{"RANK", std::to_string(rank)},
          {"WORLD_SIZE", std::to_string(world)},
          {"MASTER_ADDR", "127.0.0.1"},
          {"MASTER_PORT", std::to_string(port)}};
}

/// Every rank 0..n-1 printed "ok R CHECKS" with CHECKS >= min_checks (lines may
/// carry dopt-run's "[rank R] " prefix), and nobody printed "error ".
inline void require_all_ok(const std::string& out, int n, long min_checks = 1) {
  INFO(out);
  CHECK_FALSE(contains(out, "error "));
  std::map<int, long> ok;
  for (const std::string& line : lines_of(out)) {
    auto p = line.find("ok ");
    if (p == std::string::npos) continue;
    std::istringstream ss(line.substr(p + 3));
    int r = -1;
    long checks = 0;
    if (ss >> r >> checks) ok[r] = checks;
  }
  REQUIRE(static_cast<int>(ok.size()) == n);
  for (const auto& [r, checks] : ok) {
    CHECK(r >= 0);
    CHECK(r < n);
    CHECK(checks >= min_checks);
  }
}

/// Runs `peer args...` as n ranks through dopt-run (--master-port 0).
inline Done run_through_dopt_run(const std::string& dopt_run, const std::string& peer, int n,
                                 const std::vector<std::string>& args,
                                 const std::map<std::string, std::string>& env) {
  REQUIRE(::access(peer.c_str(), X_OK) == 0);
  std::vector<std::string> argv{dopt_run, "--nproc-per-node", std::to_string(n), "--master-port", "0", peer};
  argv.insert(argv.end(), args.begin(), args.end());
  return wait(start(argv, env));
}

/// Starts `peer args...` as n ranks by hand (RANK, WORLD_SIZE, MASTER_* set
/// here, plus env) and returns what each printed, by rank. Rank kill_last
/// (if >= 0) is waited for last, after a SIGKILL once the others are done.
inline std::vector<Done> run_ranks_by_hand(const std::string& peer, int n, const std::vector<std::string>& args,
                                           const std::map<std::string, std::string>& env, int kill_last = -1) {
  REQUIRE(::access(peer.c_str(), X_OK) == 0);
  const int port = free_port();
  std::vector<Proc> ps;
  for (int r = 0; r < n; ++r) {
    auto e = rank_env(r, n, port);
    e.insert(env.begin(), env.end());
    std::vector<std::string> argv{peer};
    argv.insert(argv.end(), args.begin(), args.end());
    ps.push_back(start(argv, e));
  }
  std::vector<Done> out(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r)
    if (r != kill_last) out[static_cast<std::size_t>(r)] = wait(ps[static_cast<std::size_t>(r)]);
  if (kill_last >= 0) {
    ::kill(ps[static_cast<std::size_t>(kill_last)].pid, SIGKILL);
    out[static_cast<std::size_t>(kill_last)] = wait(ps[static_cast<std::size_t>(kill_last)]);
  }
  for (int r = 0; r < n; ++r) out[static_cast<std::size_t>(r)].pid = ps[static_cast<std::size_t>(r)].pid;
  return out;
}

/// Names under /dev/shm that processes `ds` created ("dopt-<pid>-..."): what
/// a job left behind.
inline std::vector<std::string> shm_left_by(const std::vector<Done>& ds) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    const std::string n = e.path().filename().string();
    for (const auto& d : ds)
      if (d.pid > 0 && n.rfind("dopt-" + std::to_string(d.pid) + "-", 0) == 0) out.push_back(n);
  }
  return out;
}

/// Walks the ranks of a run (ds, by rank) in which the ranks in `victims` were
/// killed: a victim must have died of a signal (of `signal`, where nonzero);
/// every other rank goes to survivor(r, d), which checks it. Each rank's
/// checks run under an INFO naming it and what it printed. Test thread.
inline void check_victims_and_survivors(const std::vector<Done>& ds, const std::vector<int>& victims,
                                        const std::function<void(int, const Done&)>& survivor, int signal = 0) {
  for (int r = 0; r < static_cast<int>(ds.size()); ++r) {
    const Done& d = ds[static_cast<std::size_t>(r)];
    INFO("rank " << r << ": " << d.out);
    if (std::find(victims.begin(), victims.end(), r) != victims.end()) {
      CHECK(WIFSIGNALED(d.status));
      if (signal != 0 && WIFSIGNALED(d.status)) CHECK(WTERMSIG(d.status) == signal);
      continue;
    }
    survivor(r, d);
  }
}

/// `peer args...` as n ranks through dopt-run: every rank must exit 0 and print "ok R CHECKS >= min_checks".
inline void require_ok_through_dopt_run(const std::string& dopt_run, const std::string& peer, int n,
                                        const std::vector<std::string>& args,
                                        const std::map<std::string, std::string>& env, long min_checks) {
  const Done d = run_through_dopt_run(dopt_run, peer, n, args, env);
  INFO(d.out);
  REQUIRE(d.ok());
  require_all_ok(d.out, n, min_checks);
}

/// The same with the ranks started by hand.
inline void require_ok_by_hand(const std::string& peer, int n, const std::vector<std::string>& args,
                               const std::map<std::string, std::string>& env, long min_checks) {
  std::string all;
  const auto ds = run_ranks_by_hand(peer, n, args, env);
  for (int r = 0; r < n; ++r) {
    const Done& d = ds[static_cast<std::size_t>(r)];
    INFO("rank " << r << ": " << d.out);
    CHECK(d.ok());
    all += d.out;
  }
  require_all_ok(all, n, min_checks);
}

#ifdef DOPT_BINARY_DIR
/// A program of this build's tools/ (dopt-run, dopt-train, ...).
inline std::string tool_path(const std::string& name) { return std::string(DOPT_BINARY_DIR) + "/tools/" + name; }

/// A rank program of tests/ (build/tests/dopt_<name>_peer) and the
/// environment every rank of it gets; what a multi-process test launches.
struct PeerProgram {
  std::string name;
  std::map<std::string, std::string> env;

  std::string path() const { return std::string(DOPT_BINARY_DIR) + "/tests/dopt_" + name + "_peer"; }
  /// n ranks through dopt-run; what dopt-run printed (every rank's lines, prefixed).
  Done through_dopt_run(int n, const std::vector<std::string>& args) const {
    return run_through_dopt_run(tool_path("dopt-run"), path(), n, args, env);
  }
  /// n ranks started by hand; what each printed, by rank (see run_ranks_by_hand).
  std::vector<Done> by_hand(int n, const std::vector<std::string>& args, int kill_last = -1) const {
    return run_ranks_by_hand(path(), n, args, env, kill_last);
  }
  /// Every rank of a run through dopt-run printed "ok R CHECKS" with CHECKS >=
  /// min_checks (n is in Catch's context).
  void require_ok_through_dopt_run(int n, const std::vector<std::string>& args, long min_checks) const {
    INFO(n << " processes");
    testing::require_ok_through_dopt_run(tool_path("dopt-run"), path(), n, args, env, min_checks);
  }
  /// The same with the ranks started by hand.
  void require_ok_by_hand(int n, const std::vector<std::string>& args, long min_checks) const {
    INFO(n << " processes");
    testing::require_ok_by_hand(path(), n, args, env, min_checks);
  }
  /// A fresh folder for one case of this program ("dopt-<name>-mp-<pid>-<what>").
  TempDir case_dir(const std::string& what) const { return TempDir("dopt-" + name + "-mp", what); }
};
#endif

}  // namespace dopt::testing
