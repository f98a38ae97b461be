// dopt-run: starts the ranks of one node with the launch contract that
// torchrun sets (docs/launching.md).
//
//   dopt-run --nproc-per-node N [--nnodes M|MIN:MAX --node-rank K]
//            [--master-addr A --master-port P] [--grace S]
//            [--on-failure stop|continue|replace] [--max-replacements R] PROGRAM ARGS...
//
// Each of the N processes gets RANK = K*N + i, WORLD_SIZE = N*M, LOCAL_RANK =
// i, LOCAL_WORLD_SIZE = N, GROUP_RANK = K, GROUP_WORLD_SIZE = M, MASTER_ADDR,
// MASTER_PORT. --master-port 0 picks a free port on 127.0.0.1 (one node only:
// with --nnodes > 1 every node must be given the same port).
//
// --nnodes MIN:MAX (an elastic job, docs/launching.md "Nodes that arrive
// later"): the world has MAX*N rank slots (WORLD_SIZE), and every rank gets
// DOPT_MIN_WORLD_SIZE=MIN*N. Nodes 0..MIN-1 start the job: rank 0's
// rendezvous completes once their ranks have joined, and the slots of the
// other nodes are vacant (lost from the start). A node K >= MIN joins the
// running job whenever it comes: its ranks start as newcomers of their
// vacant slots (DOPT_REPLACES=<rank>, DOPT_INCARNATION=<n + 1>), admitted
// with the job's id and secret, and the members grow() to take them. It
// needs --on-failure continue or replace (a program that goes on without
// some ranks, and grows).
//
// Job identity (docs/launching.md, "Who may join"): on one node, dopt-run
// gives the ranks a job id of its own (DOPT_JOB_ID=dopt-run-<random>) unless
// DOPT_JOB_ID is set already, and a fresh random secret in a file only the
// user can read (DOPT_SECRET_FILE, removed when dopt-run ends) unless
// DOPT_SECRET or DOPT_SECRET_FILE is set or --no-secret is given. Ranks of
// several nodes need the same DOPT_JOB_ID and secret on every node: dopt-run
// cannot make those up, so it passes on what the environment has.
//
// Every line a rank writes to stdout / stderr is written to dopt-run's
// stdout / stderr as "[rank R] line"; a last line without a newline is
// flushed (with one) when the rank's output ends. Ranks read stdin from
// /dev/null. Each rank runs in its own process group, so that stopping a rank
// also stops what it started.
//
// SIGINT / SIGTERM / SIGHUP sent to dopt-run are forwarded to every rank.
// Ctrl-Z (SIGTSTP) stops every rank (SIGSTOP) and then dopt-run; SIGCONT
// (fg, bg) continues the ranks with it. When a rank exits non-zero or is
// killed by a signal, dopt-run prints
//   dopt-run: rank R failed with exit code C    (or: killed by signal S)
// sends SIGTERM (and SIGCONT) to the other ranks and SIGKILL to those still
// running after the grace period (--grace, default 5 s). Blame goes to the
// rank that failed first in time: a rank stopped by someone else (SIGSTOP)
// before the failure is named ("rank 1 was stopped by signal 19 (SIGSTOP)
// 10.2 s before: it failed first"), and among ranks that end together, one
// killed by a signal comes before one that exited with an error.
//
// With --on-failure continue, a rank that fails is reported ("rank R killed
// by signal S ...; the other ranks continue") and the others go on (programs
// that survive the loss of a rank: ProcessGroup::shrink, ZeRO's
// redundancy); once all ended: "N rank(s) failed (...), M finished", and the
// exit status is the first failed rank's exit code if one exited non-zero (an
// error of its own), else 0 when some rank finished. A rank that exits with
// code 75 (kExitRemoved: it was cut off or removed from the job, and the
// others may go on without it; dopt-train --survive) counts as lost, like a
// killed rank, not as an error of its own; when no rank finished, 75 if the
// first failed rank exited 75, else 128 + S of its signal (continued_status).
//
// With --on-failure replace, a rank other than 0 that fails (as above, exit
// 75 included) is reported ("...; starting its replacement (incarnation N,
// --on-failure replace)") and started again, unless it was the last rank
// running of a single-node job (nobody is left to take it) or rank 0 has
// ended (its rendezvous port went with it: on this node its process ended, on
// another its port refuses connections): the same command and launch environment
// (RANK, LOCAL_RANK, ... of the lost rank) plus DOPT_REPLACES=<its rank> and
// DOPT_INCARNATION=N (1 for its first replacement); every rank gets
// DOPT_ON_FAILURE=<stop|continue|replace> from the start. The program must then
// join the running job (ProcessGroup::join_group) instead of starting one;
// the other ranks grow() their group to take it (docs/growing-back-processes.md,
// "Between processes"). At most --max-replacements (default 10) are started
// in all; a failure after that is handled as with --on-failure continue.
// Once all ended: "N replacement(s) started (...)", and the exit status is
// that of --on-failure continue over the last process of each rank.
//
// Exit status: 0 when every rank exits 0; the first failed rank's exit code
// (128 + S when killed by signal S); 128 + S when dopt-run itself got signal
// S; 2 for a usage error; 127 when PROGRAM cannot be executed; 1 for other
// errors of dopt-run itself.
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <arpa/inet.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>

#include "dopt_run_nodes.hpp"
#include "dopt_run_output.hpp"
#include "dopt_run_secret.hpp"

extern char** environ;

namespace {

using dopt_run::pick_free_port;
using dopt_run::refuses_connections;
using dopt_run::say;
using dopt_run::SecretFile;
using dopt_run::Stream;
using dopt_run::random_hex;
using Clock = std::chrono::steady_clock;

int g_signal_pipe[2] = {-1, -1};

void on_signal(int sig) {
  const int saved = errno;
  const unsigned char b = static_cast<unsigned char>(sig);
  [[maybe_unused]] ssize_t n = ::write(g_signal_pipe[1], &b, 1);
  errno = saved;
}

struct Rank {
  int rank = 0;
  int incarnation = 0;  // --on-failure replace: how many times it was replaced
  pid_t pid = -1;
  bool running = false;
  // Stopped by someone other than dopt-run (SIGSTOP, a debugger): since when.
  std::optional<Clock::time_point> stopped_since;
  int stop_signal = 0;
  Stream out, err;
};

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : std::to_string(sig);
}

std::string describe(int status) {
  if (WIFEXITED(status)) return "exit code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return "signal " + std::to_string(WTERMSIG(status)) + " (" + signal_name(WTERMSIG(status)) + ")";
  }
  return "status " + std::to_string(status);
}

// Splits argv into dopt-run's own arguments and PROGRAM ARGS...: the program
// is the first argument that is neither an option nor an option's value, or
// the argument after "--".
std::size_t find_program(int argc, char** argv) {
  static const std::set<std::string> with_value = {"--nproc-per-node", "--nnodes",      "--node-rank",
                                                   "--master-addr",    "--master-port", "--grace",
                                                   "--on-failure",     "--max-replacements"};
  // (--no-secret and --no-prefix take no value)
  int i = 1;
  while (i < argc) {
    const std::string a = argv[i];
    if (a == "--") return static_cast<std::size_t>(i + 1);
    if (a.size() > 1 && a[0] == '-') {
      i += (with_value.count(a) ? 2 : 1);
      continue;
    }
    return static_cast<std::size_t>(i);
  }
  return static_cast<std::size_t>(argc);
}

struct Config {
  bool no_secret = false;
  std::string job_id;       // DOPT_JOB_ID for the ranks ("" = pass the environment's on)
  std::string secret_file;  // DOPT_SECRET_FILE for the ranks ("" = none made here)
  int nproc_per_node = 0;
  int nnodes = 1;      // --nnodes M, or MAX of --nnodes MIN:MAX
  int nnodes_min = 1;  // MIN of --nnodes MIN:MAX (M when not elastic)
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  double grace_s = 5.0;
  bool no_prefix = false;
  bool continue_on_failure = false;  // --on-failure continue (or replace, once no replacement is left)
  bool replace_on_failure = false;   // --on-failure replace
  std::string on_failure = "stop";   // --on-failure, as given (DOPT_ON_FAILURE for the ranks)
  int max_replacements = 10;         // --max-replacements
  std::vector<std::string> command;
};

/// --nnodes MIN:MAX: this node is not one of the MIN that start the job, so
/// its ranks join the running job as newcomers of their vacant slots.
bool late_node(const Config& c) { return c.nnodes_min < c.nnodes && c.node_rank >= c.nnodes_min; }

/// The launch environment of local rank `local_rank`; incarnation > 0: the
/// replacement of its lost process (DOPT_REPLACES, DOPT_INCARNATION). A late
/// node's ranks are newcomers from the start: incarnation + 1.
std::vector<std::string> child_environment(const Config& c, int local_rank, int incarnation) {
  const std::vector<std::pair<std::string, std::string>> ours = {
      {"RANK", std::to_string(c.node_rank * c.nproc_per_node + local_rank)},
      {"WORLD_SIZE", std::to_string(c.nproc_per_node * c.nnodes)},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"LOCAL_WORLD_SIZE", std::to_string(c.nproc_per_node)},
      {"GROUP_RANK", std::to_string(c.node_rank)},
      {"GROUP_WORLD_SIZE", std::to_string(c.nnodes)},
      {"MASTER_ADDR", c.master_addr},
      {"MASTER_PORT", std::to_string(c.master_port)},
  };
  std::vector<std::pair<std::string, std::string>> extra;
  if (!c.job_id.empty()) extra.emplace_back("DOPT_JOB_ID", c.job_id);
  if (!c.secret_file.empty()) extra.emplace_back("DOPT_SECRET_FILE", c.secret_file);
  // Every rank knows whether replacements may come (a program that cannot take one refuses to start).
  extra.emplace_back("DOPT_ON_FAILURE", c.on_failure);
  // (Never passed on from dopt-run's own environment: only a replacement has them.)
  const std::set<std::string> replacement_keys = {"DOPT_REPLACES", "DOPT_INCARNATION", "DOPT_MIN_WORLD_SIZE"};
  if (c.nnodes_min < c.nnodes)
    extra.emplace_back("DOPT_MIN_WORLD_SIZE", std::to_string(c.nproc_per_node * c.nnodes_min));
  if (late_node(c)) ++incarnation;
  if (incarnation > 0) {
    extra.emplace_back("DOPT_REPLACES", std::to_string(c.node_rank * c.nproc_per_node + local_rank));
    extra.emplace_back("DOPT_INCARNATION", std::to_string(incarnation));
  }
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e) {
    const std::string kv = *e;
    const std::string key = kv.substr(0, kv.find('='));
    bool replaced = replacement_keys.count(key) > 0;
    for (const auto& [k, v] : ours) replaced = replaced || k == key;
    for (const auto& [k, v] : extra) replaced = replaced || k == key;
    if (!replaced) env.push_back(kv);
  }
  for (const auto& [k, v] : ours) env.push_back(k + "=" + v);
  for (const auto& [k, v] : extra) env.push_back(k + "=" + v);
  return env;
}

/// The state letter of /proc/PID/stat ('R', 'S', 'T', ...), '?' when unknown.
char process_state(pid_t pid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  std::FILE* f = std::fopen(path, "r");
  if (!f) return '?';
  char buf[512] = {};
  const std::size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  const char* close = nullptr;
  for (std::size_t i = 0; i < n; ++i)
    if (buf[i] == ')') close = buf + i;
  return close && close + 2 < buf + n ? close[2] : '?';
}

class Launcher {
 public:
  explicit Launcher(Config c) : cfg_(std::move(c)) {}

  int run() {
    if (::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
      say(std::string("pipe: ") + std::strerror(errno));
      return 1;
    }
    ::signal(SIGPIPE, SIG_IGN);
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;  // SIGCHLD also when a rank stops or continues
    for (int sig : {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGTSTP, SIGCONT}) ::sigaction(sig, &sa, nullptr);

    ranks_.resize(static_cast<std::size_t>(cfg_.nproc_per_node));
    for (int i = 0; i < cfg_.nproc_per_node; ++i) {
      if (!spawn(i)) {
        stop_all(SIGTERM);
        start_grace();
        loop();
        return exec_failed_ ? 127 : 1;
      }
    }
    loop();
    if (exec_failed_) return 127;  // a replacement could not be executed (said so)
    if (!replaced_.empty() && !got_signal_) {
      std::string who;
      for (int rank : replaced_) who += (who.empty() ? "" : ", ") + std::to_string(rank);
      say(std::to_string(replaced_.size()) + " replacement(s) started (ranks " + who + ")");
    }
    if (cfg_.continue_on_failure && !lost_.empty() && !got_signal_) return continued_status();
    if (first_failure_) {
      const int st = first_failure_->second;
      return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    if (got_signal_) return 128 + got_signal_;
    return 0;
  }

 private:
  bool spawn(int local) {
    Rank& r = ranks_[static_cast<std::size_t>(local)];
    r.rank = cfg_.node_rank * cfg_.nproc_per_node + local;
    r.stopped_since.reset();
    int out[2], err[2], exec_err[2];
    if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0 || ::pipe2(exec_err, O_CLOEXEC) != 0) {
      say(std::string("pipe: ") + std::strerror(errno));
      return false;
    }
    const std::vector<std::string> env = child_environment(cfg_, local, r.incarnation);
    std::vector<char*> envp, argv;
    for (const std::string& s : env) envp.push_back(const_cast<char*>(s.c_str()));
    envp.push_back(nullptr);
    for (const std::string& s : cfg_.command) argv.push_back(const_cast<char*>(s.c_str()));
    argv.push_back(nullptr);
    const pid_t parent = ::getpid();

    // Signals stay blocked across fork until the child has reset its
    // handlers: a signal meant for the child must not run ours there.
    sigset_t all, old_mask;
    sigfillset(&all);
    ::sigprocmask(SIG_BLOCK, &all, &old_mask);
    const pid_t pid = ::fork();
    if (pid != 0) ::sigprocmask(SIG_SETMASK, &old_mask, nullptr);
    if (pid < 0) {
      say(std::string("fork: ") + std::strerror(errno));
      return false;
    }
    if (pid == 0) {
      // Child: default signal handling, own process group, pipes as stdio.
      struct sigaction dfl {};
      dfl.sa_handler = SIG_DFL;
      sigemptyset(&dfl.sa_mask);
      for (int sig : {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGTSTP, SIGCONT}) ::sigaction(sig, &dfl, nullptr);
      sigset_t none;
      sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(1);
      const int devnull = ::open("/dev/null", O_RDONLY);
      if (devnull >= 0) ::dup2(devnull, STDIN_FILENO);
      ::dup2(out[1], STDOUT_FILENO);
      ::dup2(err[1], STDERR_FILENO);
      ::execvpe(argv[0], argv.data(), envp.data());
      const int e = errno;
      [[maybe_unused]] ssize_t n = ::write(exec_err[1], &e, sizeof e);
      ::_exit(127);
    }
    ::setpgid(pid, pid);  // also here, so kill(-pid) works at once
    ::close(out[1]);
    ::close(err[1]);
    ::close(exec_err[1]);
    r.pid = pid;
    r.running = true;
    ++running_;
    const std::string prefix = cfg_.no_prefix ? std::string() : "[rank " + std::to_string(r.rank) + "] ";
    r.out = Stream{out[0], STDOUT_FILENO, prefix, {}};
    r.err = Stream{err[0], STDERR_FILENO, prefix, {}};
    ::fcntl(out[0], F_SETFL, O_NONBLOCK);
    ::fcntl(err[0], F_SETFL, O_NONBLOCK);

    int e = 0;
    ssize_t n;
    do {
      n = ::read(exec_err[0], &e, sizeof e);
    } while (n < 0 && errno == EINTR);
    ::close(exec_err[0]);
    if (n == static_cast<ssize_t>(sizeof e)) {
      say("cannot execute '" + cfg_.command[0] + "': " + std::strerror(e));
      exec_failed_ = true;
      return false;
    }
    return true;
  }

  void stop_all(int sig) {
    for (Rank& r : ranks_) {
      if (!r.running) continue;
      ::kill(-r.pid, sig);
      // A stopped rank acts on SIGTERM only once it runs again.
      if (sig != SIGKILL && sig != SIGSTOP && sig != SIGCONT) ::kill(-r.pid, SIGCONT);
    }
  }

  void start_grace() {
    if (!kill_deadline_) {
      kill_deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double>(cfg_.grace_s));
    }
  }

  void reap() {
    // Everything that ended since the last look, then blame in order of time:
    // a rank that someone else stopped earlier, then ranks killed by a
    // signal, then ranks that exited with an error.
    std::vector<std::pair<Rank*, int>> ended;
    for (;;) {
      int status = 0;
      const pid_t pid = ::waitpid(-1, &status, WNOHANG | WUNTRACED | WCONTINUED);
      if (pid <= 0) {
        if (pid < 0 && errno == EINTR) continue;
        break;
      }
      for (Rank& r : ranks_) {
        if (r.pid != pid || !r.running) continue;
        if (WIFSTOPPED(status)) {
          if (!suspending_ && !r.stopped_since) {
            r.stopped_since = Clock::now();
            r.stop_signal = WSTOPSIG(status);
          }
        } else if (WIFCONTINUED(status)) {
          r.stopped_since.reset();
        } else {
          ended.emplace_back(&r, status);
        }
      }
    }
    std::stable_sort(ended.begin(), ended.end(), [](const auto& a, const auto& b) {
      return WIFSIGNALED(a.second) && !WIFSIGNALED(b.second);
    });
    // Rank 0 (on this node) ended, however: its rendezvous port is closed,
    // and a replacement started now or later could only fail.
    for (auto& [rp, status] : ended)
      if (rp->rank == 0) rank0_gone_ = "rank 0 has ended";
    for (auto& [rp, status] : ended) {
      Rank& r = *rp;
      r.running = false;
      --running_;
      const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      // On another node, rank 0's end shows as its rendezvous port refusing connections.
      if (!ok && cfg_.replace_on_failure && cfg_.node_rank != 0 && rank0_gone_.empty() && !stopping_ &&
          !got_signal_ && refuses_connections(cfg_.master_addr, cfg_.master_port))
        rank0_gone_ = "rank 0's port " + cfg_.master_addr + ":" + std::to_string(cfg_.master_port) +
                      " refuses connections";
      if (exec_failed_) {
        // the reason was printed already
      } else if (!ok && cfg_.replace_on_failure && !stopping_ && !got_signal_ && r.rank != 0 && rank0_gone_.empty() &&
                 (running_ > 0 || cfg_.nnodes > 1) &&
                 static_cast<int>(replaced_.size()) < cfg_.max_replacements) {
        replace(r, status);
      } else if (!ok && cfg_.continue_on_failure && !stopping_ && !got_signal_) {
        lost_.emplace_back(r.rank, status);
        say("rank " + std::to_string(r.rank) + " " + describe_end(status) +
            (running_ == 0 ? ""
             : !cfg_.replace_on_failure ? "; the other ranks continue (--on-failure continue)"
             : r.rank == 0 ? "; the other ranks continue (--on-failure replace: rank 0 is not replaced, the job's "
                             "rendezvous went with it)"
             : !rank0_gone_.empty() ? "; the other ranks continue (--on-failure replace: " + rank0_gone_ +
                                          ", a replacement would find no job to join)"
                           : "; the other ranks continue (--on-failure replace: --max-replacements " +
                                 std::to_string(cfg_.max_replacements) + " reached)"));
      } else if (!ok && !first_failure_ && !stopping_ && !got_signal_) {
        first_failure_ = std::make_pair(r.rank, status);
        if (WIFEXITED(status)) {
          say("rank " + std::to_string(r.rank) + " failed with exit code " + std::to_string(WEXITSTATUS(status)));
        } else {
          say("rank " + std::to_string(r.rank) + " killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
              signal_name(WTERMSIG(status)) + ")");
        }
        blame_stopped_rank();
        if (running_ > 0) {
          say("stopping the other ranks (SIGTERM, SIGKILL after " + fmt_seconds(cfg_.grace_s) + ")");
          stopping_ = true;
          stop_all(SIGTERM);
          start_grace();
        }
      } else if (stopping_ || got_signal_) {
        say("rank " + std::to_string(r.rank) + " stopped: " + describe(status));
      }
    }
  }

  /// --on-failure replace: rank r's process ended with `status`; what it
  /// wrote is passed on, then its replacement starts (the next incarnation).
  /// One that cannot be executed stops the job as at the start.
  void replace(Rank& r, int status) {
    replaced_.push_back(r.rank);
    ++r.incarnation;
    say("rank " + std::to_string(r.rank) + " " + describe_end(status) + "; starting its replacement (incarnation " +
        std::to_string(r.incarnation + (late_node(cfg_) ? 1 : 0)) + ", --on-failure replace)");
    for (Stream* s : {&r.out, &r.err}) {
      if (s->fd < 0) continue;
      s->read_some();
      s->close_stream();
    }
    if (!spawn(r.rank - cfg_.node_rank * cfg_.nproc_per_node)) {
      stopping_ = true;
      stop_all(SIGTERM);
      start_grace();
    }
  }

  /// Exit code of a rank that was cut off or removed from the job (a
  /// stopped process, the minority side of a partition): with --on-failure
  /// continue it is lost, not failed (docs/fault-tolerance.md, "Who goes on").
  static constexpr int kExitRemoved = 75;  // sysexits EX_TEMPFAIL: a code programs rarely use for errors

  static std::string describe_end(int status) {
    if (WIFEXITED(status) && WEXITSTATUS(status) == kExitRemoved)
      return "left the job: cut off or removed (exit code " + std::to_string(kExitRemoved) + ")";
    if (WIFEXITED(status)) return "failed with exit code " + std::to_string(WEXITSTATUS(status));
    return "killed by signal " + std::to_string(WTERMSIG(status)) + " (" + signal_name(WTERMSIG(status)) + ")";
  }

  /// --on-failure continue, once every rank ended: the first rank that exited
  /// with a non-zero code other than kExitRemoved (an error of its own: e.g.
  /// it could not recover) gives the status; else 0 when some rank finished;
  /// else kExitRemoved when the first was removed; else (every rank was
  /// killed) 128 + the first one's signal.
  int continued_status() const {
    const int finished = static_cast<int>(ranks_.size()) - static_cast<int>(lost_.size());
    std::string who;
    for (const auto& [rank, st] : lost_) who += (who.empty() ? "" : ", ") + std::to_string(rank);
    say(std::to_string(lost_.size()) + " rank(s) failed (" + who + "), " + std::to_string(finished) + " finished");
    for (const auto& [rank, st] : lost_)
      if (WIFEXITED(st) && WEXITSTATUS(st) != kExitRemoved) return WEXITSTATUS(st);
    if (finished > 0) return 0;
    if (WIFEXITED(lost_.front().second)) return kExitRemoved;
    return 128 + WTERMSIG(lost_.front().second);
  }

  /// The first failure may be a consequence: a rank that was stopped (not by
  /// dopt-run) before it is what the others lost first.
  void blame_stopped_rank() {
    const Rank* first = nullptr;
    for (const Rank& r : ranks_)
      if (r.running && r.stopped_since && (!first || *r.stopped_since < *first->stopped_since)) first = &r;
    if (!first) return;
    const double ago = std::chrono::duration<double>(Clock::now() - *first->stopped_since).count();
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f s", ago);
    say("rank " + std::to_string(first->rank) + " was stopped by signal " + std::to_string(first->stop_signal) +
        " (" + signal_name(first->stop_signal) + ") " + buf + " before: it failed first, the others followed");
  }

  static std::string fmt_seconds(double s) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g s", s);
    return buf;
  }

  void handle_signals() {
    unsigned char buf[64];
    for (;;) {
      const ssize_t n = ::read(g_signal_pipe[0], buf, sizeof buf);
      if (n <= 0) return;
      for (ssize_t i = 0; i < n; ++i) {
        const int sig = buf[i];
        if (sig == SIGCHLD) continue;  // reaped below
        if (sig == SIGTSTP) {
          suspend();
          continue;
        }
        if (sig == SIGCONT) {
          resume();
          continue;
        }
        if (!got_signal_) got_signal_ = sig;
        if (running_ > 0) {
          say("got " + signal_name(sig) + ", forwarding it to the ranks");
          stop_all(sig);
          start_grace();
        }
      }
    }
  }

  /// Ctrl-Z: stop the ranks, then this process (as the terminal asked).
  void suspend() {
    if (running_ == 0) return;
    say("got SIGTSTP, stopping the ranks (continue them with fg or bg)");
    suspending_ = true;
    stop_all(SIGSTOP);
    // Stop only once the ranks have (signals are delivered asynchronously).
    const auto until = Clock::now() + std::chrono::seconds(1);
    for (Rank& r : ranks_) {
      while (r.running && Clock::now() < until) {
        const char st = process_state(r.pid);
        if (st == 'T' || st == 't' || st == 'Z' || st == '?') break;
        ::usleep(1000);
      }
    }
    struct sigaction dfl {}, ours {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    ::sigaction(SIGTSTP, &dfl, &ours);
    ::raise(SIGTSTP);  // stops here until SIGCONT
    ::sigaction(SIGTSTP, &ours, nullptr);
    resume();
  }

  /// SIGCONT (fg, bg, kill -CONT): the ranks go on too.
  void resume() {
    if (!suspending_) return;
    suspending_ = false;
    say("continuing the ranks");
    stop_all(SIGCONT);
  }

  void loop() {
    while (running_ > 0) {
      std::vector<pollfd> fds;
      std::vector<Stream*> streams;
      fds.push_back({g_signal_pipe[0], POLLIN, 0});
      for (Rank& r : ranks_) {
        for (Stream* s : {&r.out, &r.err}) {
          if (s->fd < 0) continue;
          fds.push_back({s->fd, POLLIN, 0});
          streams.push_back(s);
        }
      }
      int timeout_ms = -1;
      if (kill_deadline_) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*kill_deadline_ - Clock::now());
        timeout_ms = left.count() < 0 ? 0 : static_cast<int>(left.count()) + 1;
      }
      const int n = ::poll(fds.data(), fds.size(), timeout_ms);
      if (n < 0 && errno != EINTR) {
        say(std::string("poll: ") + std::strerror(errno));
        stop_all(SIGKILL);
      }
      if (n > 0) {
        for (std::size_t i = 1; i < fds.size(); ++i) {
          if (fds[i].revents) streams[i - 1]->read_some();
        }
      }
      handle_signals();
      reap();
      if (kill_deadline_ && running_ > 0 && Clock::now() >= *kill_deadline_) {
        for (Rank& r : ranks_) {
          if (!r.running) continue;
          say("rank " + std::to_string(r.rank) + " still running after " + fmt_seconds(cfg_.grace_s) +
              ", sending SIGKILL");
          ::kill(-r.pid, SIGKILL);
        }
        kill_deadline_.reset();
        kill_sent_ = true;
      }
    }
    // Every rank has exited: what it wrote before is in the pipes. Drain
    // without waiting for EOF (a process the rank left behind may hold them).
    for (Rank& r : ranks_) {
      for (Stream* s : {&r.out, &r.err}) {
        if (s->fd < 0) continue;
        s->read_some();
        s->close_stream();
      }
    }
  }

  Config cfg_;
  std::vector<Rank> ranks_;
  int running_ = 0;
  bool stopping_ = false;
  bool suspending_ = false;  // the ranks were stopped by us (Ctrl-Z)
  bool exec_failed_ = false;
  bool kill_sent_ = false;
  int got_signal_ = 0;
  std::optional<std::pair<int, int>> first_failure_;  // rank, wait status
  std::vector<std::pair<int, int>> lost_;             // --on-failure continue: rank, wait status
  std::vector<int> replaced_;                         // --on-failure replace: the rank of each replacement started
  std::string rank0_gone_;  // how this node saw rank 0 end ("": it did not): no replacement is started after that
  std::optional<Clock::time_point> kill_deadline_;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Start the ranks of one node with the torchrun launch contract (RANK, WORLD_SIZE, LOCAL_RANK, "
               "LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT)",
               "dopt-run"};
  Config cfg;
  std::string program;
  app.add_option("--nproc-per-node", cfg.nproc_per_node, "Processes (ranks) to start on this node")
      ->required()
      ->check(CLI::PositiveNumber);
  std::string nnodes = "1";
  app.add_option("--nnodes", nnodes,
                 "Number of nodes M (default 1), or MIN:MAX: the job starts with nodes 0..MIN-1 and nodes MIN..MAX-1 "
                 "may join it later (their ranks are newcomers; needs --on-failure continue or replace)");
  app.add_option("--node-rank", cfg.node_rank, "Rank of this node, 0..nnodes-1 (0..MAX-1 with MIN:MAX; default 0)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--master-addr", cfg.master_addr, "Address of rank 0's rendezvous (default 127.0.0.1)");
  app.add_option("--master-port", cfg.master_port, "Port of rank 0's rendezvous; 0 picks a free one (default 29500)")
      ->check(CLI::Range(0, 65535));
  app.add_option("--grace", cfg.grace_s,
                 "Seconds between SIGTERM and SIGKILL when stopping the ranks (default 5)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--no-secret", cfg.no_secret,
               "Do not make a secret for the ranks (connections between them are then not authenticated)");
  app.add_flag("--no-prefix", cfg.no_prefix,
               "Pass the ranks' output through as it is (whole lines), without the \"[rank R] \" prefix");
  std::string on_failure = "stop";
  app.add_option("--on-failure", on_failure,
                 "stop: when a rank fails, stop the others (default); continue: report it and let the others "
                 "go on (programs that survive the loss of a rank; a rank that exits 75 left the job: cut off or removed, "
                 "counted as lost); replace: as continue, and start the lost rank's program again with its launch "
                 "environment plus DOPT_REPLACES=<rank> and DOPT_INCARNATION=<n>: started so, the program must join "
                 "the running job (ProcessGroup::join_group) while the others grow() their group")
      ->check(CLI::IsMember({"stop", "continue", "replace"}));
  app.add_option("--max-replacements", cfg.max_replacements,
                 "--on-failure replace: replacements to start at most, in all (default 10); later failures are "
                 "handled as with --on-failure continue")
      ->check(CLI::NonNegativeNumber);
  app.add_option("program", program, "Program to run, followed by its arguments")->required();
  app.footer("Everything from PROGRAM on is passed to it unparsed; use -- before a PROGRAM that starts with '-'.");

  const std::size_t prog = find_program(argc, argv);
  std::vector<char*> own(argv, argv + std::min<std::size_t>(prog, static_cast<std::size_t>(argc)));
  // The program name follows a "--" already when it starts with '-'.
  if (prog < static_cast<std::size_t>(argc)) own.push_back(argv[prog]);
  try {
    app.parse(static_cast<int>(own.size()), own.data());
    const dopt_run::NodeCount nodes = dopt_run::parse_nnodes(nnodes, on_failure);
    cfg.nnodes_min = nodes.min;
    cfg.nnodes = nodes.max;
    if (cfg.node_rank >= cfg.nnodes) {
      throw CLI::ValidationError("--node-rank", "--node-rank " + std::to_string(cfg.node_rank) +
                                                     " must be less than --nnodes " +
                                                     (cfg.nnodes_min < cfg.nnodes ? "MAX " : "") +
                                                     std::to_string(cfg.nnodes));
    }
    if (cfg.master_addr.empty()) throw CLI::ValidationError("--master-addr", "--master-addr must not be empty");
    if (cfg.master_port == 0 && cfg.nnodes > 1)
      throw CLI::ValidationError("--master-port", "--master-port 0 picks a free port on this node only; with "
                                                  "--nnodes > 1 give every node the same port");
    if (!std::isfinite(cfg.grace_s)) throw CLI::ValidationError("--grace", "--grace must be finite");
    if (static_cast<long long>(cfg.nproc_per_node) * cfg.nnodes > 1 << 20) {
      throw CLI::ValidationError("--nproc-per-node", "--nproc-per-node * --nnodes is too large");
    }
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  cfg.command.assign(argv + prog, argv + argc);
  cfg.on_failure = on_failure;
  cfg.replace_on_failure = on_failure == "replace";
  cfg.continue_on_failure = on_failure == "continue" || cfg.replace_on_failure;

  if (cfg.master_port == 0) {
    cfg.master_port = pick_free_port();
    if (cfg.master_port <= 0) {
      say(std::string("cannot pick a free port on 127.0.0.1: ") + std::strerror(errno));
      return 1;
    }
  }
  // The job's identity and secret (see the top of this file).
  std::optional<SecretFile> secret;
  const auto set = [](const char* name) {
    const char* v = std::getenv(name);
    return v && *v;
  };
  try {
    if (cfg.nnodes == 1) {
      if (!set("DOPT_JOB_ID")) cfg.job_id = "dopt-run-" + random_hex(8);
      if (!cfg.no_secret && !set("DOPT_SECRET") && !set("DOPT_SECRET_FILE")) {
        secret.emplace();
        cfg.secret_file = secret->path();
      }
    } else if (!set("DOPT_SECRET") && !set("DOPT_SECRET_FILE") && !cfg.no_secret) {
      say("note: the ranks of this job are not authenticated: give every node the same DOPT_SECRET_FILE "
          "(or --no-secret to silence this note)");
    }
  } catch (const std::exception& e) {
    say(e.what());
    return 1;
  }
  return Launcher(std::move(cfg)).run();
}
