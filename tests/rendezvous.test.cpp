// The rendezvous of real processes (actors/dopt/actors/rendezvous.hpp): the
// helper tests/rendezvous_peer.cpp is started as separate processes, through
// dopt-run or by hand with its environment set here. CTest gives each of these
// a 60 s TIMEOUT and the label "multiprocess" (tests/rendezvous.cmake).
#include <catch2/catch.hpp>

#include "processes.hpp"

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

using namespace dopt::testing;

const std::string kDoptRun = std::string(DOPT_BINARY_DIR) + "/tools/dopt-run";
const std::string kPeer = std::string(DOPT_BINARY_DIR) + "/tests/dopt_rendezvous_peer";

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
