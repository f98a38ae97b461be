// Collectives between real processes (actors/dopt/actors/distributed.hpp):
// tests/collectives_peer.cpp is one rank; it checks every result against
// values it computes itself and prints "ok R CHECKS". Launched through
// dopt-run, by hand (environment set here) and through OpenMPI's mpirun.
// CTest label "multiprocess", 60 s timeout (tests/rendezvous.cmake).
#include <catch2/catch.hpp>

#include <signal.h>

#include <sstream>
#include <thread>
#include <utility>

#include "processes.hpp"

namespace {

using namespace dopt::testing;

const std::string kDoptRun = std::string(DOPT_BINARY_DIR) + "/tools/dopt-run";
const std::string kPeer = std::string(DOPT_BINARY_DIR) + "/tests/dopt_collectives_peer";

void battery_through_dopt_run(int n, const std::string& transport = "auto") {
  const Done d = run_through_dopt_run(kDoptRun, kPeer, n, {"battery"},
                                      {{"DOPT_TIMEOUT_MS", "30000"}, {"DOPT_TRANSPORT", transport}});
  INFO(d.out);
  REQUIRE(d.ok());
  require_all_ok(d.out, n, 300);
}

std::vector<Done> run_by_hand(int n, const std::string& mode, const std::map<std::string, std::string>& env = {},
                              int kill_last = -1) {
  return run_ranks_by_hand(kPeer, n, {mode}, env, kill_last);
}

long elapsed_ms(const std::string& out) {
  auto p = out.find("elapsed_ms ");
  return p == std::string::npos ? -1 : std::stol(out.substr(p + 11));
}

/// A run whose rank 1 was killed: every other rank failed with
/// PeerLostError naming `lost`, well within its 20 s timeout, and nothing of
/// the job is left in /dev/shm.
void check_rank1_killed(const std::vector<Done>& ds, const std::string& lost) {
  check_victims_and_survivors(ds, {1}, [&](int, const Done& d) {
    CHECK(d.failed());
    CHECK(contains(d.out, "error PeerLostError"));
    CHECK(contains(d.out, lost));
    CHECK(elapsed_ms(d.out) < 20000);
  });
  CHECK(shm_left_by(ds).empty());
}

}  // namespace

TEST_CASE("collectives: 2 processes through dopt-run, every op and dtype", "[collectives][multiprocess]") {
  battery_through_dopt_run(2);
}

TEST_CASE("collectives: 5 processes through dopt-run, every op and dtype", "[collectives][multiprocess]") {
  battery_through_dopt_run(5);
}

TEST_CASE("collectives: 2 processes over the TCP data plane", "[collectives][multiprocess]") {
  battery_through_dopt_run(2, "tcp");
}

TEST_CASE("collectives: 1 process and 3 processes over TCP and staged and cross-memory shared memory started by hand",
          "[collectives][multiprocess]") {
  // Staged with 64 KiB buffers (large calls take many rounds), and the cross-memory path (opt-in).
  const std::map<std::string, std::string> staged{{"DOPT_SHM_BUFFER_BYTES", "65536"}};
  const std::map<std::string, std::string> cma{{"DOPT_SHM_CMA", "1"}};
  const std::map<std::string, std::string> none;
  for (auto [n, transport, extra] : {std::tuple<int, const char*, const std::map<std::string, std::string>*>{
                                         1, "auto", &none},
                                     {3, "tcp", &none},
                                     {3, "auto", &staged},
                                     {3, "auto", &cma}}) {
    INFO(n << " processes, transport " << transport << (extra->empty() ? "" : extra->count("DOPT_SHM_CMA") ? ", cross-memory" : ", staged"));
    auto env = *extra;
    env["DOPT_TIMEOUT_MS"] = "30000";
    env["DOPT_TRANSPORT"] = transport;
    auto ds = run_by_hand(n, "battery", env);
    for (auto& d : ds) {
      INFO(d.out);
      CHECK(d.ok());
    }
  }
}

TEST_CASE("collectives: 5 processes over the TCP data plane", "[collectives][multiprocess]") {
  battery_through_dopt_run(5, "tcp");
}

TEST_CASE("collectives: an unknown DOPT_TRANSPORT is a ValueError naming it", "[collectives][multiprocess]") {
  auto ds = run_by_hand(2, "battery", {{"DOPT_TRANSPORT", "carrier-pigeon"}});
  for (auto& d : ds) {
    INFO(d.out);
    CHECK(d.failed());
    CHECK(contains(d.out, "error ValueError"));
    CHECK(contains(d.out, "DOPT_TRANSPORT=\"carrier-pigeon\" is not one of auto,shm,tcp"));
  }
}

TEST_CASE("collectives: 3 processes started by hand", "[collectives][multiprocess]") {
  auto ds = run_by_hand(3, "battery", {{"DOPT_TIMEOUT_MS", "30000"}});
  std::string all;
  for (auto& d : ds) {
    INFO(d.out);
    CHECK(d.ok());
    all += d.out;
  }
  require_all_ok(all, 3, 300);
}

TEST_CASE("collectives: different collectives on different processes fail on every rank, naming both",
          "[collectives][multiprocess]") {
  auto ds = run_by_hand(3, "mismatch", {{"DOPT_TIMEOUT_MS", "20000"}});
  for (auto& d : ds) {
    INFO(d.out);
    CHECK(d.failed());
    // the users' calls first (call_label.hpp), grouped by rank, then the collectives
    for (const char* part : {"error CollectiveMismatchError",
                             "ProcessGroup::all_reduce() on rank 0; ProcessGroup::broadcast() on ranks 1, 2; internally: ",
                             "rank 0 called all_reduce(sum, float32, [8])", "called broadcast(src 0, float32, [8])"})
      CHECK(contains(d.out, part));
  }
}

TEST_CASE("collectives: a process killed in the middle of an all_reduce fails the others, naming it",
          "[collectives][multiprocess]") {
  const int n = GENERATE(2, 3, 5);
  const std::string transport = GENERATE(as<std::string>{}, "shm", "tcp");
  const long timeout_ms = 20000;
  INFO("world size " << n << ", transport " << transport);
  auto ds = run_by_hand(n, "kill", {{"DOPT_TIMEOUT_MS", std::to_string(timeout_ms)}, {"DOPT_TRANSPORT", transport}});
  check_victims_and_survivors(ds, {1}, [&](int, const Done& d) {
    CHECK(d.failed());
    CHECK(contains(d.out, "error PeerLostError"));
    // (a rank that had not yet received rank 1's barrier message sees it lost there)
    // Seen by the control plane ("rank 1 was lost during ...: the connection to its
    // process was lost") or, over TCP, first by the ring ("connection to rank 1 lost").
    CHECK((contains(d.out, "rank 1 was lost") || contains(d.out, "connection to rank 1 lost")));
    CHECK(contains(d.out, "connection"));
    const long ms = elapsed_ms(d.out);
    CHECK(ms >= 0);
    CHECK(ms < timeout_ms);  // seen at once, not at the timeout
  });
  CHECK(shm_left_by(ds).empty());  // nothing of the job stays in /dev/shm
}

TEST_CASE("collectives: a process killed while its 8 MiB send is in flight fails its receiver and the others",
          "[collectives][multiprocess]") {
  const int n = GENERATE(2, 3, 5);
  INFO("world size " << n);
  auto ds = run_by_hand(n, "p2pkill", {{"DOPT_TIMEOUT_MS", "20000"}});
  check_rank1_killed(ds, "rank 1 was lost");
}

#ifdef DOPT_MPIRUN
TEST_CASE("collectives: 2 processes through OpenMPI's mpirun", "[collectives][multiprocess]") {
  const int port = free_port();
  const Done d = wait(start({DOPT_MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", "2", "--mca", "btl",
                             "self,tcp", "-x", "MASTER_ADDR=127.0.0.1", "-x", "MASTER_PORT=" + std::to_string(port),
                             "-x", "DOPT_TIMEOUT_MS=30000", kPeer, "battery"},
                            {{"RANK", ""}, {"WORLD_SIZE", ""}}));
  INFO(d.out);
  REQUIRE(d.ok());
  require_all_ok(d.out, 2, 300);
}
#endif

/// n_hosts x per_host ranks on this machine, each "host" a DOPT_HOST_ID of its
/// own: the hierarchical plane over the TCP mesh on loopback. host1_extra:
/// more variables for the ranks of host 1 only.
std::vector<Done> run_as_hosts(int n_hosts, int per_host, const std::string& mode,
                               std::map<std::string, std::string> extra = {},
                               std::map<std::string, std::string> host1_extra = {}) {
  const int n = n_hosts * per_host, port = free_port();
  std::vector<Proc> ps;
  for (int r = 0; r < n; ++r) {
    auto e = rank_env(r, n, port);
    e["LOCAL_RANK"] = std::to_string(r % per_host);
    e["LOCAL_WORLD_SIZE"] = std::to_string(per_host);
    e["DOPT_HOST_ID"] = "host" + std::to_string(r / per_host);
    for (const auto& [k, v] : extra) e[k] = v;
    if (r / per_host == 1)
      for (const auto& [k, v] : host1_extra) e[k] = v;
    ps.push_back(start({kPeer, mode}, e));
  }
  std::vector<Done> out;
  for (auto& p : ps) {
    out.push_back(wait(p));
    out.back().pid = p.pid;
  }
  return out;
}

TEST_CASE("collectives: hosts of 2 ranks (DOPT_HOST_ID) run on the hierarchical plane, every op and dtype",
          "[collectives][multiprocess]") {
  const int hosts = GENERATE(2, 3);
  INFO(hosts << " hosts of 2 ranks");
  auto ds = run_as_hosts(hosts, 2, "battery", {{"DOPT_TIMEOUT_MS", "60000"}});
  for (std::size_t r = 0; r < ds.size(); ++r) {
    INFO("rank " << r << ": " << ds[r].out);
    CHECK(ds[r].ok());
    // The same values as on one host (the battery checks them against its own
    // references), and the two-level path taken: bytes crossed between hosts.
    CHECK(contains(ds[r].out, "plane hier "));
    const auto p = ds[r].out.find("plane hier ");
    CHECK((p != std::string::npos && std::stoull(ds[r].out.substr(p + 11)) > 0));
  }
  CHECK(shm_left_by(ds).empty());
}

TEST_CASE("collectives: on the hierarchical plane, a mismatch between hosts fails every rank, a killed rank is named",
          "[collectives][multiprocess]") {
  // One rank per host too: there the records travel with the data of calls
  // up to 4 MiB (hier_ring.cpp), 32 bytes ("mismatch") and 4 MiB ("mismatch_big").
  for (auto [per_host, mode] : {std::pair{2, "mismatch"}, std::pair{1, "mismatch"}, std::pair{1, "mismatch_big"}}) {
    auto ds = run_as_hosts(2, per_host, mode, {{"DOPT_TIMEOUT_MS", "20000"}});
    for (std::size_t r = 0; r < ds.size(); ++r) {
      INFO(per_host << " ranks per host, " << mode << ", rank " << r << ": " << ds[r].out);
      CHECK(ds[r].failed());
      CHECK(contains(ds[r].out, "error CollectiveMismatchError"));
      CHECK(contains(ds[r].out, "called all_reduce"));
      CHECK(contains(ds[r].out, "ProcessGroup::all_reduce() on rank 0; ProcessGroup::broadcast() on rank"));
      const long ms = elapsed_ms(ds[r].out);
      CHECK(ms >= 0);
      CHECK(ms < 20000);
    }
  }
  {
    // Hosts whose shared-memory buffers differ would cut their messages
    // differently: the first call fails on every rank, naming the setting.
    auto ds = run_as_hosts(2, 2, "battery", {{"DOPT_TIMEOUT_MS", "20000"}}, {{"DOPT_SHM_BUFFER_BYTES", "2097152"}});
    for (std::size_t r = 0; r < ds.size(); ++r) {
      INFO("different DOPT_SHM_BUFFER_BYTES, rank " << r << ": " << ds[r].out);
      CHECK(ds[r].failed());
      CHECK(contains(ds[r].out, "error CollectiveMismatchError"));
      CHECK(contains(ds[r].out, "DOPT_SHM_BUFFER_BYTES must be the same on every host"));
      CHECK(elapsed_ms(ds[r].out) < 20000);
    }
    CHECK(shm_left_by(ds).empty());
  }
  {
    auto ds = run_as_hosts(2, 2, "kill", {{"DOPT_TIMEOUT_MS", "20000"}});
    check_rank1_killed(ds, "rank 1");
  }
}

TEST_CASE("collectives: on the hierarchical plane, a mismatch between hosts names every rank with its call",
          "[collectives][multiprocess]") {
  // Each host's ranks agree among themselves, the hosts differ (the lower
  // half of the ranks all_reduce, the rest broadcast): every rank is named
  // with its call, not only the two whose records were compared.
  const auto [hosts, per_host] = GENERATE(std::pair{2, 2}, std::pair{3, 1});
  auto ds = run_as_hosts(hosts, per_host, "mismatch_half", {{"DOPT_TIMEOUT_MS", "20000"}});
  const std::string want = per_host == 2
                               ? "ProcessGroup::all_reduce() on ranks 0, 1; ProcessGroup::broadcast() on ranks 2, 3; "
                                 "internally: "
                               : "ProcessGroup::all_reduce() on rank 0; ProcessGroup::broadcast() on ranks 1, 2; "
                                 "internally: ";
  for (std::size_t r = 0; r < ds.size(); ++r) {
    INFO(hosts << " hosts of " << per_host << ", mismatch_half, rank " << r << ": " << ds[r].out);
    CHECK(ds[r].failed());
    CHECK(contains(ds[r].out, "error CollectiveMismatchError"));
    CHECK(contains(ds[r].out, want));
  }
  CHECK(shm_left_by(ds).empty());
}

TEST_CASE("collectives: ranks suspended together for longer than the peer timeout go on when continued",
          "[collectives][multiprocess]") {
  // As dopt-run does on Ctrl-Z: every rank stopped, 3 s (three peer
  // timeouts), then continued: nobody may take the others' silence during
  // its own suspension for a loss.
  const int port = free_port();
  std::vector<Proc> ps;
  for (int r = 0; r < 2; ++r) {
    auto e = rank_env(r, 2, port);
    e["DOPT_PEER_TIMEOUT_MS"] = "1000";
    ps.push_back(start({kPeer, "loop"}, e));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  for (auto& p : ps) ::kill(p.pid, SIGSTOP);
  std::this_thread::sleep_for(std::chrono::milliseconds(3000));
  for (auto& p : ps) ::kill(p.pid, SIGCONT);
  for (int r = 0; r < 2; ++r) {
    const Done d = wait(ps[static_cast<std::size_t>(r)]);
    INFO("rank " << r << ": " << d.out);
    CHECK(d.ok());
  }
}

TEST_CASE("collectives: a process that stops answering (SIGSTOP) is lost after the peer timeout",
          "[collectives][multiprocess]") {
  const int n = GENERATE(2, 3, 5);
  INFO("world size " << n);
  const long timeout_ms = 40000;  // the collective's own timeout: the peer timeout (3 s here) comes first
  auto ds = run_by_hand(n, "stop", {{"DOPT_TIMEOUT_MS", std::to_string(timeout_ms)}, {"DOPT_PEER_TIMEOUT_MS", "3000"}}, 1);
  CHECK(shm_left_by(ds).empty());  // once the stopped one is killed too
  for (int r = 0; r < n; ++r) {
    if (r == 1) continue;
    const Done& d = ds[static_cast<std::size_t>(r)];
    INFO("rank " << r << ": " << d.out);
    CHECK(d.failed());
    CHECK(contains(d.out, "error PeerLostError"));
    CHECK(contains(d.out, "rank 1 was lost"));
    const long ms = elapsed_ms(d.out);
    // The message gives the silence measured, and detection comes within a
    // tenth of the peer timeout of it.
    CHECK(contains(d.out, "no word from its process for 3"));
    CHECK(contains(d.out, "the limit is 3000 ms"));
    CHECK(ms >= 2700);
    CHECK(ms < 6000);
  }
}
