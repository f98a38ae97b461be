// The rendezvous of real processes (actors/dopt/actors/rendezvous.hpp): the
// helper tests/rendezvous_peer.cpp is started as separate processes, through
// dopt-run or by hand with its environment set here. CTest gives each of these
// a 60 s TIMEOUT and the label "multiprocess" (tests/rendezvous.cmake).
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

const std::string kDoptRun = std::string(DOPT_BINARY_DIR) + "/tools/dopt-run";
const std::string kPeer = std::string(DOPT_BINARY_DIR) + "/tests/dopt_rendezvous_peer";

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::stringstream ss(text);
  std::string line;
  while (std::getline(ss, line)) lines.push_back(line);
  return lines;
}

bool contains(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }

struct Proc {
  pid_t pid = -1;
  std::string out_path;
};

struct Done {
  int status = -1;
  std::string out;
  bool ok() const { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }
  bool failed() const { return WIFEXITED(status) && WEXITSTATUS(status) == 1; }
};

// Starts argv with the environment overrides (empty value: unset); stdout and
// stderr go to one file.
Proc start(std::vector<std::string> argv, const std::map<std::string, std::string>& env) {
  static int counter = 0;
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

Done wait(const Proc& p) {
  Done d;
  REQUIRE(::waitpid(p.pid, &d.status, 0) == p.pid);
  d.out = slurp(p.out_path);
  ::unlink(p.out_path.c_str());
  return d;
}

// A socket listening on INADDR_ANY at an ephemeral port; closed by the destructor.
struct Listener {
  int fd = -1;
  int port = 0;
  Listener() {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd >= 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = 0;
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(fd, 4) == 0);
    socklen_t len = sizeof a;
    REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    port = ntohs(a.sin_port);
  }
  ~Listener() { ::close(fd); }
};

// A port nobody listens on right now (bound to port 0, then closed).
int free_port() {
  Listener l;
  return l.port;
}

std::map<std::string, std::string> rank_env(int rank, int world, int port) {
  return {{"RANK", std::to_string(rank)},
          {"WORLD_SIZE", std::to_string(world)},
          {"MASTER_ADDR", "127.0.0.1"},
          {"MASTER_PORT", std::to_string(port)}};
}

void check_world_through_dopt_run(int n) {
  REQUIRE(::access(kDoptRun.c_str(), X_OK) == 0);
  REQUIRE(::access(kPeer.c_str(), X_OK) == 0);
  const Done d = wait(start({kDoptRun, "--nproc-per-node", std::to_string(n), "--master-port", "0", kPeer, "20000"}, {}));
  INFO(d.out);
  REQUIRE(d.ok());
  // "[rank R] self R NAME", "[rank R] table R r NAME", "[rank R] done R"
  std::map<int, std::string> self;
  std::map<int, std::map<int, std::string>> tables;
  std::map<int, int> done;
  for (const std::string& line : lines_of(d.out)) {
    std::istringstream ss(line);
    std::string prefix, rank_tok, what;
    ss >> prefix >> rank_tok >> what;
    if (prefix != "[rank") continue;
    const int pr = std::stoi(rank_tok);  // "R]"
    int r = -1, peer = -1;
    std::string name;
    if (what == "self") {
      ss >> r >> name;
      CHECK(r == pr);
      self[r] = name;
    } else if (what == "table") {
      ss >> r >> peer >> name;
      CHECK(r == pr);
      tables[r][peer] = name;
    } else if (what == "done") {
      ss >> r;
      CHECK(r == pr);
      ++done[r];
    }
  }
  REQUIRE(self.size() == static_cast<std::size_t>(n));
  REQUIRE(tables.size() == static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    REQUIRE(tables[r].size() == static_cast<std::size_t>(n));
    CHECK(tables[r] == tables[0]);          // everybody got the same table
    CHECK(tables[0][r] == self[r]);         // entry r is rank r's own actor
    CHECK(done[r] == 1);                    // and passed the closing barriers
  }
  std::set<std::string> distinct;
  for (const auto& [r, name] : tables[0]) distinct.insert(name);
  CHECK(distinct.size() == static_cast<std::size_t>(n));
}

}  // namespace

TEST_CASE("rendezvous: 2 processes through dopt-run see each other", "[rendezvous][multiprocess]") {
  check_world_through_dopt_run(2);
}

TEST_CASE("rendezvous: 5 processes through dopt-run see each other", "[rendezvous][multiprocess]") {
  check_world_through_dopt_run(5);
}

TEST_CASE("rendezvous: a duplicate rank fails every rank, naming it", "[rendezvous][multiprocess]") {
  REQUIRE(::access(kPeer.c_str(), X_OK) == 0);
  // World of 3 with rank 2 missing: both RANK=1 processes register before the
  // world is complete, so the rendezvous fails for all three.
  const int port = free_port();
  std::vector<Proc> procs;
  procs.push_back(start({kPeer, "20000"}, rank_env(0, 3, port)));
  procs.push_back(start({kPeer, "20000"}, rank_env(1, 3, port)));
  procs.push_back(start({kPeer, "20000"}, rank_env(1, 3, port)));
  for (const Proc& p : procs) {
    const Done d = wait(p);
    INFO(d.out);
    CHECK(d.failed());
    CHECK(contains(d.out, "error ValueError: "));
    CHECK(contains(d.out, "rank 1 registered twice"));
  }
}

TEST_CASE("rendezvous: a world size that differs from rank 0's fails, naming the rank", "[rendezvous][multiprocess]") {
  REQUIRE(::access(kPeer.c_str(), X_OK) == 0);
  const int port = free_port();
  const Proc p0 = start({kPeer, "20000"}, rank_env(0, 2, port));
  const Proc p1 = start({kPeer, "20000"}, rank_env(1, 3, port));
  for (const Proc& p : {p0, p1}) {
    const Done d = wait(p);
    INFO(d.out);
    CHECK(d.failed());
    CHECK(contains(d.out, "error ValueError: "));
    CHECK(contains(d.out, "rank 1 has world size 3 but rank 0 has world size 2"));
  }
}

TEST_CASE("rendezvous: a peer that never arrives is a TimeoutError naming it", "[rendezvous][multiprocess]") {
  REQUIRE(::access(kPeer.c_str(), X_OK) == 0);
  const int port = free_port();
  const Done d = wait(start({kPeer, "500"}, rank_env(0, 3, port)));
  INFO(d.out);
  CHECK(d.failed());
  CHECK(contains(d.out, "error TimeoutError: "));
  CHECK(contains(d.out, "missing ranks: 1, 2"));
}

TEST_CASE("rendezvous: rank 0 on a port in use is an IOError", "[rendezvous][multiprocess]") {
  REQUIRE(::access(kPeer.c_str(), X_OK) == 0);
  Listener busy;
  const Done d = wait(start({kPeer, "2000"}, rank_env(0, 1, busy.port)));
  INFO(d.out);
  CHECK(d.failed());
  CHECK(contains(d.out, "error IOError: "));
  CHECK(contains(d.out, "cannot listen on port " + std::to_string(busy.port)));
}

TEST_CASE("rendezvous: a rank that cannot reach rank 0 is a TimeoutError", "[rendezvous][multiprocess]") {
  REQUIRE(::access(kPeer.c_str(), X_OK) == 0);
  const int port = free_port();
  const Done d = wait(start({kPeer, "500"}, rank_env(1, 2, port)));
  INFO(d.out);
  CHECK(d.failed());
  CHECK(contains(d.out, "error TimeoutError: "));
  CHECK(contains(d.out, "could not reach rank 0 at 127.0.0.1:" + std::to_string(port)));
}
