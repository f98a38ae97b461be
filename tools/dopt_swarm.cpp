// dopt-swarm: runs a program whose ranks run under dopt::simulate over a
// swarm of seeds (docs/testing.md, "Running a program under the swarm").
//
//   dopt-swarm [--seeds N] [--first S] [--budget SECONDS] [--faults SPEC] [--no-check] -- PROGRAM [ARGS...]
//       runs PROGRAM once per seed (twice with the determinism check), with
//       DOPT_SIM_SEED, DOPT_SIM_FAULTS and DOPT_SIM_TRACE_LOG set, until it exits
//       non-zero, the seeds are used up or the budget is spent; exit code 1
//       with the failing seed and how to replay it
//   dopt-swarm --replay S [--faults SPEC] -- PROGRAM [ARGS...]
//       runs seed S once, showing PROGRAM's output; exits as PROGRAM did
//   dopt-swarm --diff A B [--faults SPEC] -- PROGRAM [ARGS...]
//       runs seeds A and B with DOPT_SIM_TRACE_DUMP and prints where their
//       traces part (A == B: two runs of one seed, a determinism check)
//
// The program itself decides what a failure is (its exit code); every
// simulate() call in it becomes deterministic with the seed.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <CLI/CLI.hpp>

#include "dopt/actors/sim.hpp"

namespace {

struct Args {
  int seeds = 100;
  unsigned long long first = 1;
  double budget_s = 60;
  std::string faults;
  bool check = true;
  std::optional<unsigned long long> replay;
  std::optional<std::pair<unsigned long long, unsigned long long>> diff;
  std::vector<std::string> program;
};

/// The command line (CLI11, as dopt-run and dopt-train parse theirs).
/// Returns the exit code when it must stop here (--help: 0; an error: 2).
std::optional<int> parse(int argc, char** argv, Args& a) {
  CLI::App app{"dopt-swarm: runs PROGRAM (whose ranks run under dopt::simulate) over a swarm of seeds, "
               "replays one seed, or diffs two seeds' traces (docs/testing.md)",
               "dopt-swarm"};
  app.add_option("--seeds", a.seeds, "How many seeds to try")->check(CLI::Range(1, 1000000000))->capture_default_str();
  app.add_option("--first", a.first, "The first seed")->capture_default_str();
  app.add_option("--budget", a.budget_s, "Stop starting seeds after this many seconds (a run is not cut short)")
      ->check(CLI::Range(0.001, 1e9))
      ->capture_default_str();
  app.add_option("--faults", a.faults, "A fault plan for every run (DOPT_SIM_FAULTS, docs/testing.md)");
  app.add_flag("!--no-check", a.check, "Run each seed once, without the determinism check (two runs, equal traces)");
  unsigned long long replay = 0;
  std::vector<unsigned long long> diff;
  auto* r = app.add_option("--replay", replay, "Run this seed once, showing the program's output");
  auto* d = app.add_option("--diff", diff, "Run seeds A and B and show where their traces part")->expected(2);
  r->excludes(d);
  app.add_option("program", a.program, "The program and its arguments (after --)")->required();
  try {
    app.parse(argc, argv);
    if (!a.faults.empty()) dopt::sim::parse_faults(a.faults);  // a bad plan fails here, not in every run
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dopt-swarm: --faults: %s\n", e.what());
    return 2;
  }
  if (*r) a.replay = replay;
  if (*d) a.diff.emplace(diff[0], diff[1]);
  return std::nullopt;
}

std::string temp_file(const char* what) {
  std::string path = std::string("/tmp/dopt-swarm-") + what + "-XXXXXX";
  const int fd = ::mkstemp(path.data());
  if (fd < 0) {
    std::perror("dopt-swarm: mkstemp");
    std::exit(2);
  }
  ::close(fd);
  return path;
}

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

/// What the child prints when the program cannot be started (exit code 127).
constexpr const char* kCannotRun = "dopt-swarm: cannot run ";

/// Whether a run's exit code and output say the program never started.
bool not_started(int code, const std::string& said) {
  return code == 127 && said.find(kCannotRun) != std::string::npos;
}

/// Runs the program with seed (and the faults) in its environment, plus
/// `extra` (DOPT_SIM_TRACE_LOG or DOPT_SIM_TRACE_DUMP: the file); its output
/// goes to `out` ("" : this terminal). Returns its exit code (128 + signal
/// when killed).
int run(const Args& a, unsigned long long seed, const char* extra, const std::string& file, const std::string& out) {
  std::vector<std::string> prog = a.program;
  std::vector<char*> argv;
  for (auto& v : prog) argv.push_back(v.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  const pid_t pid = ::fork();
  if (pid < 0) {
    std::perror("dopt-swarm: fork");
    std::exit(2);
  }
  if (pid == 0) {  // the child: its environment, its output, the program
    ::unsetenv("DOPT_SIM_TRACE_LOG");
    ::unsetenv("DOPT_SIM_TRACE_DUMP");
    ::unsetenv("DOPT_SIM_FAULTS");
    ::setenv("DOPT_SIM_SEED", std::to_string(seed).c_str(), 1);
    if (!a.faults.empty()) ::setenv("DOPT_SIM_FAULTS", a.faults.c_str(), 1);
    if (extra) ::setenv(extra, file.c_str(), 1);
    if (!out.empty()) {
      const int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      if (fd < 0 || ::dup2(fd, 1) < 0 || ::dup2(fd, 2) < 0) ::_exit(126);
      ::close(fd);
    }
    ::execvp(argv[0], argv.data());
    std::fprintf(stderr, "%s%s: %s\n", kCannotRun, argv[0], std::strerror(errno));
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string replay_line(const Args& a, unsigned long long seed) {
  std::string s = "dopt-swarm --replay " + std::to_string(seed);
  if (!a.faults.empty()) s += " --faults '" + a.faults + "'";
  s += " --";
  for (const auto& p : a.program) s += " " + p;
  return s;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> v;
  std::size_t at = 0;
  while (at < text.size()) {
    std::size_t nl = text.find('\n', at);
    if (nl == std::string::npos) nl = text.size();
    v.push_back(text.substr(at, nl - at));
    at = nl + 1;
  }
  return v;
}

std::string tail(const std::string& text, std::size_t lines) {
  const auto v = lines_of(text);
  std::string out;
  for (std::size_t i = v.size() > lines ? v.size() - lines : 0; i < v.size(); ++i) out += "    " + v[i] + "\n";
  return out;
}

int swarm(const Args& a) {
  const auto start = std::chrono::steady_clock::now();
  const std::string out = temp_file("out"), log1 = temp_file("log"), log2 = temp_file("log");
  int tried = 0, rc = 0;
  for (int i = 0; i < a.seeds; ++i) {
    if (i > 0 && std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >= a.budget_s) break;
    const unsigned long long seed = a.first + static_cast<unsigned long long>(i);
    ++tried;
    std::string failure;
    std::remove(log1.c_str());
    std::remove(log2.c_str());
    const int code = run(a, seed, "DOPT_SIM_TRACE_LOG", log1, out);
    if (const std::string said = read_all(out); not_started(code, said)) {
      std::fprintf(stderr, "%s", said.c_str());  // not a seed's failure: no program to run
      rc = 2;
      break;
    }
    if (code == 0 && read_all(log1).empty()) {
      std::fprintf(stderr,
                   "dopt-swarm: %s exited 0 without a deterministic simulation (seed %llu wrote no trace to "
                   "DOPT_SIM_TRACE_LOG): it must run its ranks under dopt::simulate or dopt::rpc::simulate on the "
                   "shm plane, which DOPT_SIM_SEED makes deterministic; nothing was tested\n",
                   a.program[0].c_str(), seed);
      rc = 2;
      break;
    }
    if (code != 0) {
      failure = "exit code " + std::to_string(code) + "; its output ends with:\n" + tail(read_all(out), 20);
    } else if (a.check) {
      if (const int code2 = run(a, seed, "DOPT_SIM_TRACE_LOG", log2, out); code2 != 0)
        failure = "passed once, then failed (exit code " + std::to_string(code2) + "): not deterministic";
      else if (read_all(log1) != read_all(log2))
        failure = "two runs gave different traces: not deterministic (dopt-swarm --diff " + std::to_string(seed) + " " +
                  std::to_string(seed) + " shows where)";
    }
    if (!failure.empty()) {
      std::printf("dopt-swarm: seed %llu failed (%d seed(s) tried): %s\n  replay with: %s\n", seed, tried,
                  failure.c_str(), replay_line(a, seed).c_str());
      rc = 1;
      break;
    }
  }
  if (rc == 0)
    std::printf("dopt-swarm: %d seed(s) passed%s\n", tried, a.check ? ", each twice with equal traces" : "");
  for (const auto& f : {out, log1, log2}) std::remove(f.c_str());
  return rc;
}

int diff(const Args& a) {
  const auto [sa, sb] = *a.diff;
  const std::string out = temp_file("out"), da = temp_file("trace"), db = temp_file("trace");
  std::remove(da.c_str());
  std::remove(db.c_str());
  const int ca = run(a, sa, "DOPT_SIM_TRACE_DUMP", da, out);
  const int cb = run(a, sb, "DOPT_SIM_TRACE_DUMP", db, out);
  // The runs' summaries (one line per simulate(), the faults that fired), then the traces.
  std::vector<std::string> la, lb;
  for (auto [trace, seed, code, lines] : {std::tuple{&da, sa, ca, &la}, std::tuple{&db, sb, cb, &lb}}) {
    std::printf("seed %llu: exit code %d\n", seed, code);
    for (auto& l : lines_of(read_all(*trace))) {
      if (l.rfind("t=", 0) == 0) lines->push_back(std::move(l));
      else std::printf("  %s\n", l.c_str());
    }
  }
  const std::string said = read_all(out);
  for (const auto& f : {out, da, db}) std::remove(f.c_str());
  if (la.empty() && lb.empty()) {  // nothing to compare: a missing program, or one that simulates nothing
    std::fprintf(stderr, "%sdopt-swarm: neither run wrote a trace (exit codes %d and %d): %s must run its ranks under "
                 "dopt::simulate or dopt::rpc::simulate on the shm plane\n",
                 not_started(ca, said) || not_started(cb, said) ? said.c_str() : "", ca, cb,
                 a.program[0].c_str());
    return 2;
  }
  std::size_t i = 0;
  while (i < la.size() && i < lb.size() && la[i] == lb[i]) ++i;
  if (i == la.size() && i == lb.size()) {
    std::printf("the traces are equal (%zu scheduling points)\n", la.size());
    return 0;
  }
  std::printf("the traces (%zu and %zu scheduling points) part at point %zu:\n", la.size(), lb.size(), i + 1);
  for (std::size_t k = i >= 3 ? i - 3 : 0; k < i; ++k) std::printf("      %s\n", la[k].c_str());
  std::printf("  %llu> %s\n  %llu> %s\n", sa, i < la.size() ? la[i].c_str() : "(end)", sb,
              i < lb.size() ? lb[i].c_str() : "(end)");
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Args a;
    if (const auto code = parse(argc, argv, a)) return *code == 0 ? 0 : 2;
    if (a.diff) return diff(a);
    if (a.replay) return run(a, *a.replay, nullptr, "", "");
    return swarm(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dopt-swarm: %s\n", e.what());
    return 2;
  }
}
