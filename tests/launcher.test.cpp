// dopt-run end to end: the launcher started as a process, with /bin/sh -c
// scripts as the ranks. CTest gives each of these a 60 s TIMEOUT
// (tests/launcher.cmake) as the backstop for a launcher that would hang.
#include <catch2/catch.hpp>

#include <algorithm>

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "dopt/runtime/launch_env.hpp"
#include "text.hpp"

namespace {

using dopt::testing::contains;
using dopt::testing::lines_of;
using dopt::testing::slurp;

const std::string kDoptRun = std::string(DOPT_BINARY_DIR) + "/tools/dopt-run";

struct Result {
  int status = -1;  // raw wait status
  std::string out, err;
  bool exited() const { return WIFEXITED(status); }
  int code() const { return WEXITSTATUS(status); }
};

std::string temp_path(const char* what) {
  return "/tmp/dopt_launcher_test_" + std::to_string(::getpid()) + "_" + what;
}

// Starts dopt-run with `args`, its stdout on out_fd and its stderr into the
// file err_path; in a process group of its own if own_group. The caller
// waits for it. out_fd is close-on-exec in the caller: only stdout keeps it.
pid_t spawn_dopt_run(const std::vector<std::string>& args, int out_fd, const std::string& err_path,
                     bool own_group = false) {
  std::vector<std::string> full{kDoptRun};
  full.insert(full.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& s : full) argv.push_back(s.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    // A group of its own whose parent (this test) is in another group of the
    // session: not orphaned, so the kernel does not discard SIGTSTP (as it
    // would for an orphaned group, e.g. under some runners).
    if (own_group) ::setpgid(0, 0);
    const int e = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ::dup2(out_fd, STDOUT_FILENO);
    ::dup2(e, STDERR_FILENO);
    ::execv(argv[0], argv.data());
    ::_exit(126);
  }
  if (own_group) ::setpgid(pid, pid);
  return pid;
}

// Runs dopt-run with `args`, stdout and stderr into files, and waits for it.
Result run_dopt_run(const std::vector<std::string>& args) {
  const std::string out_path = temp_path("out"), err_path = temp_path("err");
  const int o = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  REQUIRE(o >= 0);
  const pid_t pid = spawn_dopt_run(args, o, err_path);
  ::close(o);
  Result r;
  REQUIRE(::waitpid(pid, &r.status, 0) == pid);
  r.out = slurp(out_path);
  r.err = slurp(err_path);
  ::unlink(out_path.c_str());
  ::unlink(err_path.c_str());
  return r;
}

// dopt-run whose stdout this test reads as it comes (a pipe); stderr goes to
// a file, read once it ended. Called from the test thread, which signals and
// waits for it.
struct Watched {
  pid_t pid = -1;
  int out_fd = -1;
  std::string err_path;
  std::string out;  // stdout so far

  Watched(const std::vector<std::string>& args, const char* what, bool own_group = false)
      : err_path(temp_path(what)) {
    int p[2];
    REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
    pid = spawn_dopt_run(args, p[1], err_path, own_group);
    ::close(p[1]);
    out_fd = p[0];
  }
  // Reads stdout (by blocking reads, no sleeps) while more(lines so far)
  // holds, or to its end.
  void read_while(const std::function<bool(const std::vector<std::string>&)>& more) {
    char buf[4096];
    while (more(lines_of(out))) {
      const ssize_t n = ::read(out_fd, buf, sizeof buf);
      if (n <= 0) break;
      out.append(buf, static_cast<std::size_t>(n));
    }
  }
  // Reads stdout to its end, waits for dopt-run; returns its stderr.
  std::string finish(int& status) {
    read_while([](const std::vector<std::string>&) { return true; });
    ::close(out_fd);
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    const std::string err = slurp(err_path);
    ::unlink(err_path.c_str());
    return err;
  }
};

// "[rank R] rest" -> rank -> lines; lines without a prefix go to rank -1.
std::map<int, std::vector<std::string>> by_rank(const std::string& text) {
  std::map<int, std::vector<std::string>> m;
  for (const std::string& line : lines_of(text)) {
    int rank = -1;
    std::string rest = line;
    if (line.rfind("[rank ", 0) == 0) {
      const std::size_t close = line.find("] ");
      if (close != std::string::npos) {
        rank = std::stoi(line.substr(6, close - 6));
        rest = line.substr(close + 2);
      }
    }
    m[rank].push_back(rest);
  }
  return m;
}

}  // namespace

TEST_CASE("dopt-run: every rank sees the launch contract", "[launch]") {
  REQUIRE(::access(kDoptRun.c_str(), X_OK) == 0);
  SECTION("one node, fixed port") {
    const Result r = run_dopt_run({"--nproc-per-node", "3", "--master-port", "31555", "/bin/sh", "-c", "env"});
    INFO(r.err);
    REQUIRE(r.exited());
    CHECK(r.code() == 0);
    const auto ranks = by_rank(r.out);
    CHECK(ranks.count(-1) == 0);
    REQUIRE(ranks.size() == 3);
    for (int rank = 0; rank < 3; ++rank) {
      REQUIRE(ranks.count(rank) == 1);
      std::map<std::string, std::string> env;
      for (const std::string& kv : ranks.at(rank)) {
        const std::size_t eq = kv.find('=');
        if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
      }
      CHECK(env["DOPT_JOB_ID"].rfind("dopt-run-", 0) == 0);
      env.erase("DOPT_SECRET_FILE");  // removed when dopt-run ended
      const dopt::LaunchEnv le = dopt::parse_launch_env(env);
      CHECK(le.source == "torchrun");
      CHECK(le.rank == rank);
      CHECK(le.world_size == 3);
      CHECK(le.local_rank == rank);
      CHECK(le.local_world_size == 3);
      CHECK(le.master_addr == "127.0.0.1");
      CHECK(le.master_port == 31555);
      CHECK(env["GROUP_RANK"] == "0");
    }
  }
  SECTION("second of two nodes, master address") {
    const Result r = run_dopt_run({"--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "1", "--master-addr",
                                   "10.1.2.3", "--master-port", "31556", "/bin/sh", "-c",
                                   "echo \"$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $GROUP_RANK "
                                   "$MASTER_ADDR $MASTER_PORT\""});
    INFO(r.err);
    REQUIRE(r.exited());
    CHECK(r.code() == 0);
    const auto ranks = by_rank(r.out);
    REQUIRE(ranks.size() == 2);
    std::string port[2];
    for (int local = 0; local < 2; ++local) {
      const int rank = 2 + local;
      REQUIRE(ranks.count(rank) == 1);
      REQUIRE(ranks.at(rank).size() == 1);
      std::istringstream ss(ranks.at(rank)[0]);
      int g_rank, world, l_rank, l_world, group;
      std::string addr;
      ss >> g_rank >> world >> l_rank >> l_world >> group >> addr >> port[local];
      CHECK(g_rank == rank);
      CHECK(world == 4);
      CHECK(l_rank == local);
      CHECK(l_world == 2);
      CHECK(group == 1);
      CHECK(addr == "10.1.2.3");
    }
    CHECK(port[0] == port[1]);
    CHECK(port[0] == "31556");
  }
  SECTION("one node, free port") {
    const Result r = run_dopt_run({"--nproc-per-node", "2", "--master-port", "0", "/bin/sh", "-c", "echo $MASTER_PORT"});
    REQUIRE(r.exited());
    CHECK(r.code() == 0);
    const auto ranks = by_rank(r.out);
    REQUIRE(ranks.size() == 2);
    CHECK(ranks.at(0) == ranks.at(1));
    const int p = std::atoi(ranks.at(0).at(0).c_str());
    CHECK(p >= 1);
    CHECK(p <= 65535);
  }
}

TEST_CASE("dopt-run: a failing rank stops the others and is named", "[launch]") {
  // Rank 1 fails; ranks 0 and 2 would sleep 30 s (in a child of sh, so
  // stopping them needs the process-group kill). The run only ends with them
  // "stopped: signal 15" if dopt-run terminated them.
  const Result r = run_dopt_run(
      {"--nproc-per-node", "3", "/bin/sh", "-c",
       "if [ \"$RANK\" = 1 ]; then echo failing >&2; exit 3; fi; echo waiting; sleep 30; echo slept"});
  INFO(r.err);
  REQUIRE(r.exited());
  CHECK(r.code() == 3);
  CHECK(contains(r.err, "dopt-run: rank 1 failed with exit code 3\n"));
  CHECK(contains(r.err, "[rank 1] failing\n"));
  CHECK(contains(r.err, "dopt-run: rank 0 stopped: signal 15 (SIGTERM)\n"));
  CHECK(contains(r.err, "dopt-run: rank 2 stopped: signal 15 (SIGTERM)\n"));
  CHECK_FALSE(contains(r.out, "slept"));
  CHECK_FALSE(contains(r.err, "rank 0 failed"));
  CHECK_FALSE(contains(r.err, "rank 2 failed"));

  SECTION("a rank killed by a signal") {
    const Result k = run_dopt_run(
        {"--nproc-per-node", "2", "/bin/sh", "-c", "if [ \"$RANK\" = 0 ]; then kill -KILL $$; fi; sleep 30"});
    INFO(k.err);
    REQUIRE(k.exited());
    CHECK(k.code() == 128 + SIGKILL);
    CHECK(contains(k.err, "dopt-run: rank 0 killed by signal 9 (SIGKILL)\n"));
    CHECK(contains(k.err, "dopt-run: rank 1 stopped: signal 15 (SIGTERM)\n"));
  }
  SECTION("SIGKILL after the grace period when a rank ignores SIGTERM") {
    // Rank 0 fails only once rank 1 ignores SIGTERM (it writes to a FIFO
    // that rank 0 reads), so that SIGTERM cannot reach rank 1 before.
    const std::string fifo = temp_path("fifo");
    ::unlink(fifo.c_str());
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    const Result k = run_dopt_run({"--nproc-per-node", "2", "--grace", "0.2", "/bin/sh", "-c",
                                   "if [ \"$RANK\" = 0 ]; then read x < '" + fifo + "'; exit 1; fi; "
                                   "trap '' TERM; echo go > '" + fifo + "'; while :; do sleep 1; done"});
    ::unlink(fifo.c_str());
    INFO(k.err);
    REQUIRE(k.exited());
    CHECK(k.code() == 1);
    CHECK(contains(k.err, "dopt-run: rank 0 failed with exit code 1\n"));
    CHECK(contains(k.err, "dopt-run: rank 1 still running after 0.2 s, sending SIGKILL\n"));
    CHECK(contains(k.err, "dopt-run: rank 1 stopped: signal 9 (SIGKILL)\n"));
  }
}

TEST_CASE("dopt-run: output lines are prefixed with the rank", "[launch]") {
  const Result r = run_dopt_run({"--nproc-per-node", "2", "/bin/sh", "-c",
                                 "printf 'first line\\nsecond line\\n'; printf 'to stderr\\n' >&2; "
                                 "printf 'no newline at the end'"});
  INFO(r.err);
  REQUIRE(r.exited());
  CHECK(r.code() == 0);
  const auto out = by_rank(r.out);
  const auto err = by_rank(r.err);
  const std::vector<std::string> expected_out{"first line", "second line", "no newline at the end"};
  const std::vector<std::string> expected_err{"to stderr"};
  for (int rank = 0; rank < 2; ++rank) {
    REQUIRE(out.count(rank) == 1);
    CHECK(out.at(rank) == expected_out);
    REQUIRE(err.count(rank) == 1);
    CHECK(err.at(rank) == expected_err);
  }
  CHECK(out.size() == 2);
  CHECK(err.size() == 2);
  REQUIRE_FALSE(r.out.empty());
  CHECK(r.out.back() == '\n');  // the partial last line was completed
}

TEST_CASE("dopt-run: --no-prefix passes whole lines through unchanged", "[launch]") {
  const Result r = run_dopt_run({"--nproc-per-node", "2", "--no-prefix", "/bin/sh", "-c",
                                 "printf '{\"rank\": %s}\\n' \"$RANK\""});
  REQUIRE(r.exited());
  CHECK(r.code() == 0);
  const auto out = by_rank(r.out);
  REQUIRE(out.count(-1) == 1);  // no line carries a prefix
  auto lines = out.at(-1);
  std::sort(lines.begin(), lines.end());
  CHECK(lines == std::vector<std::string>{"{\"rank\": 0}", "{\"rank\": 1}"});
}

TEST_CASE("dopt-run: forwards SIGTERM to the ranks", "[launch]") {
  Watched run({"--nproc-per-node", "2", "/bin/sh", "-c", "echo ready; sleep 30; echo slept"}, "sigerr");
  // Wait until both ranks are up.
  int ready = 0;
  run.read_while([&](const std::vector<std::string>& lines) {
    ready = 0;
    for (const std::string& line : lines) ready += line.size() > 6 && contains(line, "] ready");
    return ready < 2;
  });
  REQUIRE(ready == 2);
  REQUIRE(::kill(run.pid, SIGTERM) == 0);
  int status = 0;
  const std::string err = run.finish(status);
  const std::string& out = run.out;
  INFO(err);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 128 + SIGTERM);
  CHECK(contains(err, "dopt-run: got SIGTERM, forwarding it to the ranks\n"));
  CHECK(contains(err, "dopt-run: rank 0 stopped: signal 15 (SIGTERM)\n"));
  CHECK(contains(err, "dopt-run: rank 1 stopped: signal 15 (SIGTERM)\n"));
  CHECK_FALSE(contains(out, "slept"));
}

TEST_CASE("dopt-run: usage errors exit 2, a missing program is reported", "[launch]") {
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"--nproc-per-node", "2", "--bogus", "/bin/true"},
           {"/bin/true"},
           {"--nproc-per-node", "0", "/bin/true"},
           {"--nproc-per-node", "two", "/bin/true"},
           {"--nproc-per-node", "2"},
           {"--nproc-per-node", "1", "--nnodes", "2", "--node-rank", "2", "/bin/true"},
           {"--nproc-per-node", "1", "--master-port", "70000", "/bin/true"},
           {"--nproc-per-node", "1", "--nnodes", "2", "--master-port", "0", "/bin/true"},
       }) {
    const Result r = run_dopt_run(args);
    INFO(args[0] << " ... " << args.back() << ": " << r.err);
    REQUIRE(r.exited());
    CHECK(r.code() == 2);
    CHECK_FALSE(r.err.empty());
  }
  const Result bogus = run_dopt_run({"--nproc-per-node", "2", "--bogus", "/bin/true"});
  CHECK(contains(bogus.err, "--bogus"));
  const Result port0 = run_dopt_run({"--nproc-per-node", "1", "--nnodes", "2", "--master-port", "0", "/bin/true"});
  CHECK(contains(port0.err, "--master-port 0 picks a free port on this node only; with --nnodes > 1 give every node "
                            "the same port"));

  const Result missing = run_dopt_run({"--nproc-per-node", "2", "/nonexistent/dopt-program", "x"});
  INFO(missing.err);
  REQUIRE(missing.exited());
  CHECK(missing.code() == 127);
  CHECK(contains(missing.err, "dopt-run: cannot execute '/nonexistent/dopt-program': No such file or directory"));

  // Arguments after PROGRAM belong to it, also when they look like ours.
  const Result passthrough =
      run_dopt_run({"--nproc-per-node", "1", "/bin/echo", "--nproc-per-node", "--bogus"});
  INFO(passthrough.err);
  REQUIRE(passthrough.exited());
  CHECK(passthrough.code() == 0);
  CHECK(passthrough.out == "[rank 0] --nproc-per-node --bogus\n");
}

TEST_CASE("dopt-run: --nnodes MIN:MAX, its usage errors name the option, and a late node's ranks start as newcomers",
          "[launch]") {
  const std::vector<std::pair<std::vector<std::string>, std::string>> refused{
      {{"--nnodes", "3:2", "--on-failure", "continue"}, "--nnodes 3:2: MIN 3 is larger than MAX 2"},
      {{"--nnodes", "0:2", "--on-failure", "continue"}, "--nnodes 0:2: MIN must be a whole number >= 1"},
      {{"--nnodes", "1:x", "--on-failure", "continue"}, "--nnodes 1:x: MAX must be a whole number >= 1"},
      {{"--nnodes", "1:2"},
       "--nnodes 1:2 needs --on-failure continue or replace: the job starts without the ranks "
       "of node 1"},
      {{"--nnodes", "1:3", "--on-failure", "stop"}, "without the ranks of nodes 1..2"},
      {{"--nnodes", "1:2", "--node-rank", "2", "--on-failure", "continue"},
       "--node-rank 2 must be less than --nnodes MAX 2"},
  };
  for (const auto& [extra, says] : refused) {
    std::vector<std::string> args{"--nproc-per-node", "1", "--master-port", "29999"};
    args.insert(args.end(), extra.begin(), extra.end());
    args.push_back("/bin/true");
    const Result r = run_dopt_run(args);
    INFO(r.err);
    REQUIRE(r.exited());
    CHECK(r.code() == 2);
    CHECK(contains(r.err, says));
  }
  // Node 0 of 1:3 (2 ranks each) starts the job; node 2 arrives later: its
  // ranks are newcomers of slots 4 and 5 of 6.
  const std::string show =
      "echo $RANK $WORLD_SIZE $GROUP_WORLD_SIZE $DOPT_MIN_WORLD_SIZE r=$DOPT_REPLACES "
      "i=$DOPT_INCARNATION";
  for (const auto& [node, want] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"0", {"0 6 3 2 r= i=", "1 6 3 2 r= i="}}, {"2", {"4 6 3 2 r=4 i=1", "5 6 3 2 r=5 i=1"}}}) {
    const Result r = run_dopt_run({"--nproc-per-node", "2", "--nnodes", "1:3", "--node-rank", node, "--master-port",
                                   "29999", "--on-failure", "continue", "--no-prefix", "/bin/sh", "-c", show});
    INFO(r.out << r.err);
    REQUIRE(r.exited());
    CHECK(r.code() == 0);
    std::vector<std::string> got = lines_of(r.out);
    std::sort(got.begin(), got.end());
    CHECK(got == want);
  }
}

TEST_CASE("dopt-run: one node gets a job id and a secret file only the user can read, removed at the end",
          "[launch][reliability]") {
  const Result r = run_dopt_run({"--nproc-per-node", "2", "/bin/sh", "-c",
                                 "echo \"$DOPT_JOB_ID $DOPT_SECRET_FILE $(stat -c %a \"$DOPT_SECRET_FILE\") "
                                 "$(stat -c %a \"$(dirname \"$DOPT_SECRET_FILE\")\") $(wc -c < \"$DOPT_SECRET_FILE\")\""});
  INFO(r.err);
  REQUIRE(r.exited());
  CHECK(r.code() == 0);
  const auto ranks = by_rank(r.out);
  REQUIRE(ranks.size() == 2);
  CHECK(ranks.at(0) == ranks.at(1));  // the same job, the same secret
  std::istringstream ss(ranks.at(0).at(0));
  std::string job, file, mode, dir_mode;
  long bytes = 0;
  ss >> job >> file >> mode >> dir_mode >> bytes;
  CHECK(job.rfind("dopt-run-", 0) == 0);
  CHECK(job.size() == 9 + 16);
  CHECK(mode == "600");
  CHECK(dir_mode == "700");
  CHECK(bytes == 64);
  CHECK(::access(file.c_str(), F_OK) != 0);  // gone with dopt-run
  // A second launch is another job.
  const Result r2 = run_dopt_run({"--nproc-per-node", "1", "/bin/sh", "-c", "echo $DOPT_JOB_ID"});
  CHECK(by_rank(r2.out).at(0).at(0) != job);
  // What the environment sets wins; --no-secret makes none.
  ::setenv("DOPT_JOB_ID", "nightly-42", 1);
  const Result r3 = run_dopt_run({"--nproc-per-node", "1", "--no-secret", "/bin/sh", "-c",
                                  "echo \"$DOPT_JOB_ID [$DOPT_SECRET_FILE]\""});
  ::unsetenv("DOPT_JOB_ID");
  CHECK(by_rank(r3.out).at(0).at(0) == "nightly-42 []");
}

TEST_CASE("dopt-run: a rank stopped by someone else is blamed when another rank then fails", "[launch][reliability]") {
  // Rank 1 stops itself (as a SIGSTOP from outside would); rank 0 fails after
  // it, as a rank that loses a stopped peer does.
  const Result r = run_dopt_run({"--nproc-per-node", "2", "--grace", "2", "/bin/sh", "-c",
                                 "if [ \"$RANK\" = 1 ]; then kill -STOP $$; sleep 30; fi; sleep 0.5; "
                                 "echo 'lost rank 1' >&2; exit 1"});
  INFO(r.err);
  REQUIRE(r.exited());
  CHECK(r.code() == 1);
  CHECK(contains(r.err, "dopt-run: rank 0 failed with exit code 1\n"));
  CHECK(contains(r.err, "dopt-run: rank 1 was stopped by signal 19 (SIGSTOP) "));
  CHECK(contains(r.err, " before: it failed first, the others followed\n"));
  // SIGTERM reaches the stopped rank (dopt-run continues it), no SIGKILL needed.
  CHECK(contains(r.err, "dopt-run: rank 1 stopped: signal 15 (SIGTERM)\n"));
  CHECK_FALSE(contains(r.err, "sending SIGKILL"));
}

TEST_CASE("dopt-run: Ctrl-Z stops the ranks with dopt-run, SIGCONT continues them", "[launch][reliability]") {
  // sleep starts before the pid is printed: a shell stopped while it vforks
  // `sleep` waits in the kernel ('D') for its stopped child.
  Watched run({"--nproc-per-node", "2", "/bin/sh", "-c", "sleep 1 & echo pid $$; wait; echo done"}, "tstperr",
              /*own_group=*/true);
  const pid_t pid = run.pid;
  std::vector<int> pids;
  run.read_while([&](const std::vector<std::string>& lines) {
    pids.clear();
    for (const std::string& line : lines)
      if (auto p = line.find("] pid "); p != std::string::npos) pids.push_back(std::atoi(line.c_str() + p + 6));
    return pids.size() < 2;
  });
  REQUIRE(pids.size() == 2);
  REQUIRE(::kill(pid, SIGTSTP) == 0);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, WUNTRACED) == pid);
  CHECK(WIFSTOPPED(status));
  auto state_of = [](int p) {
    const std::string stat = slurp("/proc/" + std::to_string(p) + "/stat");
    const auto close = stat.rfind(')');
    return close == std::string::npos || close + 2 >= stat.size() ? '?' : stat[close + 2];
  };
  // A rank acts on its stop signal when it is next scheduled.
  for (int p : pids) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (state_of(p) != 'T' && std::chrono::steady_clock::now() < until) ::usleep(10 * 1000);
    INFO("rank pid " << p << " waits in " << slurp("/proc/" + std::to_string(p) + "/wchan"));
    CHECK(state_of(p) == 'T');
  }
  ::usleep(1500 * 1000);  // longer than the ranks' sleep: stopped, they print nothing
  REQUIRE(::kill(pid, SIGCONT) == 0);
  const std::string err = run.finish(status);
  const std::string& out = run.out;
  INFO(err << out);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(contains(err, "dopt-run: got SIGTSTP, stopping the ranks (continue them with fg or bg)\n"));
  CHECK(contains(err, "dopt-run: continuing the ranks\n"));
  CHECK(contains(out, "[rank 0] done\n"));
  CHECK(contains(out, "[rank 1] done\n"));
}
