// Reliability of real processes: every wait is bounded and names its cause,
// ranks of another job (or without the job's secret) never join, latecomers
// and duplicates are told at once. The ranks are tests/rendezvous_peer.cpp
// (and dopt-train), started by hand or through dopt-run. CTest labels:
// "reliability" (tests/reliability.cmake), "multiprocess" where processes
// rendezvous.
#include <catch2/catch.hpp>

#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "dopt/runtime/error.hpp"
#include "dopt/runtime/internal/handshake.hpp"
#include "processes.hpp"
#include "proc_inspect.hpp"

namespace {

using namespace dopt::testing;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

const std::string kReplay = std::string(DOPT_BINARY_DIR) + "/tools/dopt-replay";
const std::string kDoptRun = std::string(DOPT_BINARY_DIR) + "/tools/dopt-run";
const std::string kPeer = std::string(DOPT_BINARY_DIR) + "/tests/dopt_rendezvous_peer";
const std::string kColl = std::string(DOPT_BINARY_DIR) + "/tests/dopt_collectives_peer";
const std::string kTrain = std::string(DOPT_BINARY_DIR) + "/tools/dopt-train";

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::map<std::string, std::string> with(std::map<std::string, std::string> a,
                                        const std::map<std::string, std::string>& b) {
  for (const auto& [k, v] : b) a[k] = v;
  return a;
}

/// Connects to 127.0.0.1:port and sends `bytes`; true when the other side
/// then closed the connection (without answering anything but maybe a
/// refusal).
bool closed_after(int port, const std::string& bytes) {
  const int s = connect_loopback(port);
  return s < 0 || closed_after_sending(s, bytes);
}

}  // namespace

TEST_CASE("dopt-replay: a world_size that does not fit is refused before narrowing", "[reliability]") {
  const std::string src = std::string(DOPT_SHARED_DIR) + "/conformance/cases/zero_adam_ws2";
  if (!fs::exists(src)) {
    WARN("no conformance case at " << src << "; skipped");
    return;
  }
  TempDir dir("dopt-replay-world", "x");
  const fs::path c = dir.path / "case";
  fs::copy(src, c);
  const std::string json = slurp((c / "case.json").string());
  for (const std::string w : {"4294967298", "100000", "0", "-2"}) {
    INFO(w);
    std::string j = json;
    const auto at = j.find("\"world_size\": 2");
    REQUIRE(at != std::string::npos);
    j.replace(at, 15, "\"world_size\": " + w);
    std::ofstream(c / "case.json", std::ios::trunc) << j;
    const Done d = wait(start({kReplay, c.string(), "--out", (dir.path / "out.safetensors").string()}, {}));
    INFO(d.out);
    CHECK(d.failed());
    CHECK(contains(d.out, "world_size must be in 1..1024, got " + w));
  }
}

// --- no one joins who does not belong --------------------------------------------------

TEST_CASE("reliability: a rank of another job on the same port is refused at once, learning nothing of the job, and the "
          "job goes on",
          "[reliability][multiprocess][security]") {
  const int port = free_port();
  const Proc a0 = start({kPeer, "20000"}, with(rank_env(0, 2, port), {{"DOPT_JOB_ID", "job-A"}}));
  ::usleep(300 * 1000);
  const auto t0 = Clock::now();
  const Done b1 = wait(start({kPeer, "20000"}, with(rank_env(1, 2, port), {{"DOPT_JOB_ID", "job-B"}})));
  INFO(b1.out);
  CHECK(b1.failed());
  CHECK(seconds_since(t0) < 5.0);
  CHECK(contains(b1.out, "error ValueError: rendezvous [rank 1]: rank 0 at 127.0.0.1:" + std::to_string(port) +
                             " belongs to another job than this process (job 'job-B'): two jobs use "
                             "the same address and port"));
  CHECK_FALSE(contains(b1.out, "job-A"));  // a refused process is never told the job's id
  // No job id at all is not job A either.
  const Done n1 = wait(start({kPeer, "20000"}, with(rank_env(1, 2, port), {{"DOPT_JOB_ID", ""}})));
  CHECK(contains(n1.out, "belongs to another job than this process (no job id)"));
  CHECK_FALSE(contains(n1.out, "job-A"));
  const Done a1 = wait(start({kPeer, "20000"}, with(rank_env(1, 2, port), {{"DOPT_JOB_ID", "job-A"}})));
  const Done a0d = wait(a0);
  INFO(a0d.out << a1.out);
  CHECK(a0d.ok());
  CHECK(a1.ok());
  CHECK(contains(a0d.out, "refused a connection from 127.0.0.1:"));  // rank 0's note, on stderr
}

TEST_CASE("reliability: two dopt-run jobs on one port never train together", "[reliability][multiprocess][security]") {
  const int port = free_port();
  const Proc first = start({kDoptRun, "--nproc-per-node", "2", "--master-port", std::to_string(port), kPeer, "20000",
                            "4000"},
                           {});
  ::usleep(1000 * 1000);
  const Done second = wait(start({kDoptRun, "--nproc-per-node", "2", "--master-port", std::to_string(port), kPeer,
                                  "20000"},
                                 {}));
  const Done one = wait(first);
  INFO("second: " << second.out << "\nfirst: " << one.out);
  CHECK_FALSE(second.ok());
  // Whichever of its ranks fails first names the cause: its rank 0 cannot
  // listen, or its rank 1 reached the first job's rank 0 and refused it (by
  // the job id, or, when the secrets' proofs were exchanged first, by the
  // secret: dopt-run gives each job its own).
  const std::string at = "rendezvous [rank 1]: rank 0 at 127.0.0.1:" + std::to_string(port);
  const bool no_listen = contains(second.out, "[rank 0] error IOError: rendezvous [rank 0]: rank 0 cannot listen on "
                                              "port " + std::to_string(port));
  const bool refused = contains(second.out, "[rank 1] error ValueError: " + at + " belongs to another job than this "
                                                "process") ||
                       contains(second.out, "[rank 1] error AuthenticationError: " + at + " could not prove that it "
                                                "knows this job's secret");
  CHECK((no_listen || refused));
  CHECK_FALSE(contains(second.out, "done "));
  CHECK(one.ok());
  CHECK(contains(one.out, "[rank 0] done 0"));
  CHECK(contains(one.out, "[rank 1] done 1"));
}

TEST_CASE("reliability: a latecomer after the world closed is told at once, and the job goes on",
          "[reliability][multiprocess]") {
  const int port = free_port();
  const std::map<std::string, std::string> job{{"DOPT_JOB_ID", "job-late"}};
  const Proc r0 = start({kPeer, "20000", "3000"}, with(rank_env(0, 2, port), job));
  const Proc r1 = start({kPeer, "20000", "3000"}, with(rank_env(1, 2, port), job));
  // Wait until rank 0 printed done (then the world is complete).
  const auto until = Clock::now() + std::chrono::seconds(20);
  while (!contains(slurp(r0.out_path), "done 0") && Clock::now() < until) ::usleep(20 * 1000);
  const auto t0 = Clock::now();
  const Done late = wait(start({kPeer, "20000"}, with(rank_env(1, 2, port), job)));
  INFO(late.out);
  CHECK(late.failed());
  CHECK(seconds_since(t0) < 3.0);
  CHECK(contains(late.out, "error ValueError: rendezvous [rank 1]: rank 0 at 127.0.0.1:" + std::to_string(port) +
                               " refused this process: the world is already closed: all 2 ranks of job 'job-late' "
                               "(from DOPT_JOB_ID) have joined, so rank 1 is already taken"));
  CHECK(wait(r0).ok());
  CHECK(wait(r1).ok());
}

TEST_CASE("reliability: a rank lost after it joined the rendezvous fails the others at once, naming it",
          "[reliability][multiprocess]") {
  // World of 3: ranks 0 and 1 start, rank 1 joins and is killed before
  // rank 2 ever comes; rank 0 must not wait out its 60 s limit.
  const int port = free_port();
  const std::map<std::string, std::string> job{{"DOPT_JOB_ID", "job-lost"}};
  const Proc r0 = start({kPeer, "60000"}, with(rank_env(0, 3, port), job));
  const Proc r1 = start({kPeer, "60000"}, with(rank_env(1, 3, port), job));
  ::usleep(1500 * 1000);  // rank 1 has registered and waits for the table
  REQUIRE(::kill(r1.pid, SIGKILL) == 0);
  const auto t0 = Clock::now();
  const Done d0 = wait(r0);
  (void)wait(r1);
  INFO(d0.out);
  CHECK(d0.failed());
  CHECK(seconds_since(t0) < 10.0);
  CHECK(contains(d0.out, "rendezvous [rank 0]: rank 1 joined the rendezvous and was lost before every rank had "
                         "joined"));
  CHECK(contains(d0.out, "the world cannot form without it"));
}

TEST_CASE("reliability: while ranks are missing from the rendezvous, rank 0 says which, and a rank that cannot reach "
          "rank 0 says so",
          "[reliability][multiprocess]") {
  const int port = free_port();
  const std::map<std::string, std::string> job{{"DOPT_JOB_ID", "job-wait"}};
  // Rank 1 first: rank 0 is not there yet.
  const Proc r1 = start({kPeer, "60000"}, with(rank_env(1, 2, port), job));
  ::usleep(11500 * 1000);
  const Proc r0 = start({kPeer, "60000"}, with(rank_env(0, 2, port), job));
  const Done d1 = wait(r1);
  const Done d0 = wait(r0);
  INFO(d1.out << d0.out);
  CHECK(d1.ok());
  CHECK(d0.ok());
  CHECK(contains(d1.out, "rendezvous [rank 1]: cannot reach rank 0 at 127.0.0.1:" + std::to_string(port) +
                             " yet after 10 s ("));
  // Rank 0 alone for over 10 s names the rank it waits for.
  const int port2 = free_port();
  const Proc a0 = start({kPeer, "60000"}, with(rank_env(0, 2, port2), job));
  ::usleep(11500 * 1000);
  const Proc a1 = start({kPeer, "60000"}, with(rank_env(1, 2, port2), job));
  const Done e0 = wait(a0);
  const Done e1 = wait(a1);
  INFO(e0.out << e1.out);
  CHECK(e0.ok());
  CHECK(e1.ok());
  CHECK(contains(e0.out, "rendezvous [rank 0]: 1 of 2 ranks have joined after 10 s; waiting for rank 1 (the limit is "
                         "60 s"));
}

TEST_CASE("reliability: without a secret, connections that present the job id and sit idle are capped, not a "
          "descriptor leak",
          "[reliability][multiprocess][security]") {
  // Rank 0 of a world of 2 without a secret: a process that knows the job id
  // passes dopt's handshake and holds the connection. The rendezvous admits
  // 4 * 2 + 32 = 40 such connections, then refuses, naming why.
  const int port = free_port();
  const Proc r0 = start({kPeer, "20000"}, with(rank_env(0, 2, port), {{"DOPT_JOB_ID", "job-cap"}}));
  dopt::net::Credentials c;
  c.job_id = "job-cap";
  c.rank = 1;
  c.world_size = 2;
  std::vector<int> held;
  std::string refusal;
  const auto deadline = Clock::now() + std::chrono::seconds(15);
  while (held.size() < 60 && refusal.empty() && Clock::now() < deadline) {
    dopt::net::RetryLater retry;
    try {
      auto fd = dopt::net::connect_authenticated("127.0.0.1", port, dopt::net::Purpose::rendezvous, c,
                                                 std::chrono::seconds(5), deadline, "rank 0", "test", &retry);
      if (fd) held.push_back(*fd);
      else ::usleep(50 * 1000);  // rank 0 not listening yet
    } catch (const dopt::Error& e) {
      refusal = e.what();
    }
  }
  INFO(refusal);
  CHECK(held.size() == 40);
  CHECK(contains(refusal, "rank 0 refused this process: rank 0's rendezvous has admitted 40 connections presenting "
                          "this job's id without a secret, more than its 2 ranks need"));
  for (int fd : held) ::close(fd);
  // Rank 0 notes the refusal once its verdict is written.
  const auto until = Clock::now() + std::chrono::seconds(5);
  while (!contains(slurp(r0.out_path), "has admitted 40 connections") && Clock::now() < until) ::usleep(20 * 1000);
  ::kill(r0.pid, SIGTERM);
  const Done d0 = wait(r0);
  INFO(d0.out);
  CHECK(contains(d0.out, "refused a connection from 127.0.0.1:"));
  CHECK(contains(d0.out, "to rank 0's rendezvous port: rank 0's rendezvous has admitted 40 connections"));
}

TEST_CASE("reliability: MASTER_PORT held by a program that accepts and never answers fails within the handshake "
          "timeout",
          "[reliability][multiprocess]") {
  Listener silent;  // listens, never accepts, never answers
  const auto t0 = Clock::now();
  const Done d = wait(start({kPeer, "300000"}, with(rank_env(1, 2, silent.port), {{"DOPT_HANDSHAKE_TIMEOUT_MS", "1000"}})));
  INFO(d.out);
  CHECK(d.failed());
  CHECK(seconds_since(t0) < 5.0);
  CHECK(contains(d.out, "error TimeoutError: rendezvous [rank 1]: rank 0 at 127.0.0.1:" + std::to_string(silent.port) +
                            " accepted the connection but did not answer dopt's handshake within 1000 ms "
                            "(DOPT_HANDSHAKE_TIMEOUT_MS): is another program (not a dopt rank) listening on that port"));
}

TEST_CASE("reliability: a peer that cannot be reached while the ranks connect fails every rank, naming it",
          "[reliability][multiprocess]") {
  // Rank 2 advertises an address that does not resolve: rank 1 (which
  // connects to it) fails, and ranks 0 and 2 learn why at once.
  const int port = free_port();
  std::vector<Proc> ps;
  const auto t0 = Clock::now();
  for (int r = 0; r < 3; ++r) {
    auto env = with(rank_env(r, 3, port), {{"DOPT_TIMEOUT_MS", "60000"}});
    if (r == 2) env["DOPT_ADVERTISE_ADDR"] = "no-such-host.invalid";
    ps.push_back(start({kColl, "battery"}, env));
  }
  for (int r = 0; r < 3; ++r) {
    const Done d = wait(ps[static_cast<std::size_t>(r)]);
    INFO("rank " << r << ": " << d.out);
    CHECK(d.failed());
    CHECK(contains(d.out, "cannot connect to rank 2 at no-such-host.invalid:"));
    CHECK(contains(d.out, "cannot resolve 'no-such-host.invalid'"));
    if (r != 1) CHECK(contains(d.out, "rank 1 failed while the ranks connected to each other"));
  }
  CHECK(seconds_since(t0) < 15.0);
}

TEST_CASE("reliability: with a secret, every port refuses processes without it and the job goes on",
          "[reliability][multiprocess][security]") {
  TempDir dir("dopt-reliability", "knock");
  // dopt-run makes the job's id and secret; DOPT_TRANSPORT=tcp adds the data plane.
  const Proc job = start({kDoptRun, "--nproc-per-node", "2", kTrain, "--steps", "300", "--hidden", "64", "--layers", "2",
                          "--quiet", "--metrics", (dir.path / "m.jsonl").string()},
                         {{"DOPT_TRANSPORT", "tcp"}, {"DOPT_TIMEOUT_MS", "60000"}});
  // The ranks and their listening ports, once training runs.
  std::vector<int> ranks;
  std::vector<ListenSocket> ports;
  const auto until = Clock::now() + std::chrono::seconds(20);
  while (Clock::now() < until) {
    ranks = children_of(job.pid);
    ports.clear();
    for (int p : ranks)
      for (const auto& l : listening(p)) ports.push_back(l);
    if (ranks.size() == 2 && ports.size() >= 3 && !slurp((dir.path / "m.jsonl").string()).empty()) break;
    ::usleep(20 * 1000);
  }
  REQUIRE(ranks.size() == 2);
  REQUIRE(ports.size() >= 3);  // rank 0's rendezvous port, each rank's control port
  const std::string job_id = env_of(ranks[0], "DOPT_JOB_ID");
  REQUIRE(job_id.rfind("dopt-run-", 0) == 0);
  int refused = 0;
  for (const ListenSocket& l : ports) {
    INFO("port " << l.port);
    CHECK(l.addr_hex == "0100007F");  // 127.0.0.1, not every interface
    CHECK(closed_after(l.port, "garbage that is not a handshake\r\n"));
    for (const dopt::net::Purpose purpose : {dopt::net::Purpose::rendezvous, dopt::net::Purpose::control}) {
      for (const std::string secret : {"", "a-guessed-secret-0123"}) {
        dopt::net::Credentials c;
        c.job_id = job_id;  // even knowing the job id
        c.secret = secret;
        c.rank = 1;
        c.world_size = 2;
        dopt::net::RetryLater retry;
        try {
          (void)dopt::net::connect_authenticated("127.0.0.1", l.port, purpose, c, std::chrono::seconds(5),
                                                 Clock::now() + std::chrono::seconds(5), "the job", "intruder", &retry);
          FAIL("a process without the secret was admitted");
        } catch (const dopt::AuthenticationError&) {
          ++refused;
        }
      }
    }
  }
  CHECK(refused == static_cast<int>(ports.size()) * 4);
  const Done d = wait(job);
  INFO(d.out);
  CHECK(d.ok());
  CHECK(contains(d.out, "[rank 0] dopt-train: 300 steps in "));
  CHECK(contains(d.out, "refused a connection from 127.0.0.1:"));
  CHECK(contains(d.out, ": not a dopt handshake"));
  CHECK(contains(d.out, "this port requires its job's secret and the connecting process has none"));
}
