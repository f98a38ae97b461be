// Growing back between real processes: dopt-run --on-failure replace starts a
// lost rank's program again (DOPT_REPLACES, DOPT_INCARNATION); on the actor
// plane (DOPT_TRANSPORT=tcp) and on the shm plane (every rank on this host,
// the default) the replacement joins the running job through join_group()
// while the survivors grow(); on the hierarchical plane (hosts faked with
// DOPT_HOST_ID) the replacement joins the survivors' shrunk group, which
// runs on the actor plane, and grow() on the hierarchical world group
// refuses clearly (docs/growing-back-processes.md, "Between processes").
// The ranks are small shell programs, tests/grow_peer.cpp,
// tests/zero_grow_peer.cpp and tests/local_sgd_grow_peer.cpp.
// CTest label "multiprocess", 60 s timeout (tests/rendezvous.cmake).
#include <catch2/catch.hpp>

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "processes.hpp"
#include "temp_dir.hpp"

namespace {

using namespace dopt::testing;

const std::string kDoptRun = std::string(DOPT_BINARY_DIR) + "/tools/dopt-run";
const std::string kGrowPeer = std::string(DOPT_BINARY_DIR) + "/tests/dopt_grow_peer";
const std::string kZeroGrowPeer = std::string(DOPT_BINARY_DIR) + "/tests/dopt_zero_grow_peer";

/// dopt-run --on-failure replace with `options` (after it), `ranks` ranks of
/// `program` (run by /bin/sh -c), and `env` over a 30 s collective timeout.
Done run_replacing(const std::vector<std::string>& options, int ranks, const std::string& program,
                   std::map<std::string, std::string> env = {}) {
  std::vector<std::string> argv{kDoptRun, "--on-failure", "replace"};
  argv.insert(argv.end(), options.begin(), options.end());
  for (std::string a : {"--nproc-per-node", "N", "--master-port", "0", "/bin/sh", "-c", "P"})
    argv.push_back(a == "N" ? std::to_string(ranks) : a == "P" ? program : a);
  env.emplace("DOPT_TIMEOUT_MS", "30000");
  return wait(start(argv, env));
}

/// Every one of `lines` is in `out`.
void check_has(const std::string& out, const std::vector<std::string>& lines) {
  for (const std::string& line : lines) {
    INFO("expected: " << line);
    CHECK(contains(out, line));
  }
}

/// A rank that says which process it is, and (rank 1, below incarnation
/// `until`) kills itself with SIGKILL.
std::string dying_rank(int until) {
  return "echo \"rank $RANK incarnation ${DOPT_INCARNATION:-0} replaces ${DOPT_REPLACES:-none}\"; "
         "if [ \"$RANK\" = 1 ] && [ \"${DOPT_INCARNATION:-0}\" -lt " + std::to_string(until) + " ]; then "
         "kill -9 $$; fi; sleep 0.2";
}

/// Shell: this rank's "host" is DOPT_HOST_ID host0 or host1, 2 ranks each
/// (4 ranks run on the hierarchical plane).
const std::string kTwoHosts = "export DOPT_HOST_ID=host$((RANK / 2)) LOCAL_RANK=$((RANK % 2)) LOCAL_WORLD_SIZE=2; ";

/// 3 ranks of dopt_grow_peer replaced 1 (rank 1 kills itself, the others
/// shrink and wait until its replacement ended), one replacement at most,
/// which runs the peer after `prefix` (shell); `replacement_error`: what its
/// error says.
void replacement_refused(const std::string& prefix, std::map<std::string, std::string> env,
                         const std::vector<std::string>& replacement_error) {
  static int runs = 0;
  const TempDir dir("dopt-replace", std::to_string(runs++));
  const std::string mark = (dir.path / "replacement-ended").string();
  const std::string peer = kGrowPeer + " replaced 1 " + mark;
  const Done d = run_replacing({"--max-replacements", "1"}, 3,
                               "if [ -n \"$DOPT_REPLACES\" ]; then " + prefix + peer + "; touch " + mark +
                                   "; exit 1; fi; exec " + peer,
                               env);
  INFO(d.out);
  REQUIRE(WIFEXITED(d.status));
  CHECK(WEXITSTATUS(d.status) == 1);  // the replacement's error
  check_has(d.out, replacement_error);
  check_has(d.out, {"dopt-run: rank 1 killed by signal 9 (SIGKILL); starting its replacement (incarnation 1",
                    "[rank 0] ok 0 ", "[rank 2] ok 2 ", "dopt-run: 1 rank(s) failed (1), 2 finished"});
}

/// The names in /dev/shm that dopt makes ("dopt-<creator pid>-...", runtime/src/shm.cpp).
std::set<std::string> dopt_shm_names() {
  std::set<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    const std::string n = e.path().filename().string();
    if (n.rfind("dopt-", 0) == 0) names.insert(n);
  }
  return names;
}

/// The pids that lines "[rank R] pid P" in `out` name.
std::vector<std::string> printed_pids(const std::string& out) {
  std::vector<std::string> pids;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    const auto at = line.find("] pid ");
    if (line.rfind("[rank ", 0) == 0 && at != std::string::npos) pids.push_back(line.substr(at + 6));
  }
  return pids;
}

}  // namespace

TEST_CASE("replace: dopt-run --on-failure replace starts a lost rank again as its replacement",
          "[replace][multiprocess]") {
  // DOPT_REPLACES in dopt-run's own environment is not passed on to first starts.
  const Done d = run_replacing({}, 3, dying_rank(2), {{"DOPT_REPLACES", "7"}});
  INFO(d.out);
  CHECK(d.ok());
  check_has(d.out, {"[rank 0] rank 0 incarnation 0 replaces none", "[rank 1] rank 1 incarnation 0 replaces none",
                    "dopt-run: rank 1 killed by signal 9 (SIGKILL); starting its replacement (incarnation 1, "
                    "--on-failure replace)",
                    "[rank 1] rank 1 incarnation 1 replaces 1",
                    "starting its replacement (incarnation 2, --on-failure replace)",
                    "[rank 1] rank 1 incarnation 2 replaces 1", "dopt-run: 2 replacement(s) started (ranks 1, 1)"});
  CHECK_FALSE(contains(d.out, "incarnation 3"));
  CHECK_FALSE(contains(d.out, "rank(s) failed"));
}

TEST_CASE("replace: past --max-replacements a failure is handled as with --on-failure continue",
          "[replace][multiprocess]") {
  const Done d = run_replacing({"--max-replacements", "2"}, 2, dying_rank(1000));
  INFO(d.out);
  CHECK(d.ok());  // rank 0 finished
  check_has(d.out, {"[rank 1] rank 1 incarnation 2 replaces 1",
                    "dopt-run: rank 1 killed by signal 9 (SIGKILL); the other ranks continue (--on-failure "
                    "replace: --max-replacements 2 reached)",
                    "dopt-run: 2 replacement(s) started (ranks 1, 1)", "dopt-run: 1 rank(s) failed (1), 1 finished"});
  CHECK_FALSE(contains(d.out, "incarnation 3"));
}

TEST_CASE("replace: rank 0 is not replaced, and a loss with nobody left to take a replacement is not either",
          "[replace][multiprocess]") {
  SECTION("rank 0 lost: handled as with --on-failure continue") {
    const Done d = run_replacing({}, 3,
                                 "echo \"rank $RANK incarnation ${DOPT_INCARNATION:-0}\"; "
                                 "if [ \"$RANK\" = 0 ]; then kill -9 $$; fi; sleep 0.5");
    INFO(d.out);
    CHECK(d.ok());  // ranks 1 and 2 finished
    check_has(d.out, {"dopt-run: rank 0 killed by signal 9 (SIGKILL); the other ranks continue (--on-failure "
                      "replace: rank 0 is not replaced, the job's rendezvous went with it)",
                      "dopt-run: 1 rank(s) failed (0), 2 finished"});
    CHECK_FALSE(contains(d.out, "starting its replacement"));
    CHECK_FALSE(contains(d.out, "incarnation 1"));
  }
  SECTION("a rank lost after rank 0 ended: its rendezvous port went with it") {
    // Rank 0 finishes at once, rank 1 kills itself 0.5 s later, rank 2 runs on.
    const Done d = run_replacing({}, 3,
                                 "echo \"rank $RANK incarnation ${DOPT_INCARNATION:-0}\"; "
                                 "[ \"$RANK\" = 0 ] && exit 0; [ \"$RANK\" = 1 ] && sleep 0.5 && kill -9 $$; "
                                 "sleep 1.5");
    INFO(d.out);
    CHECK(d.ok());  // ranks 0 and 2 finished
    check_has(d.out, {"dopt-run: rank 1 killed by signal 9 (SIGKILL); the other ranks continue (--on-failure "
                      "replace: rank 0 has ended, a replacement would find no job to join)",
                      "dopt-run: 1 rank(s) failed (1), 2 finished"});
    CHECK_FALSE(contains(d.out, "starting its replacement"));
    CHECK_FALSE(contains(d.out, "incarnation 1"));
  }
  SECTION("the last rank running of a one-node job lost: nobody is left to take its replacement") {
    const Done d = run_replacing({}, 2,
                                 "echo \"rank $RANK incarnation ${DOPT_INCARNATION:-0}\"; "
                                 "if [ \"$RANK\" = 1 ]; then sleep 0.5; kill -9 $$; fi");
    INFO(d.out);
    CHECK(d.ok());  // rank 0 finished
    check_has(d.out, {"dopt-run: rank 1 killed by signal 9 (SIGKILL)", "dopt-run: 1 rank(s) failed (1), 1 finished"});
    CHECK_FALSE(contains(d.out, "starting its replacement"));
    CHECK_FALSE(contains(d.out, "incarnation 1"));
  }
}

TEST_CASE("replace: on another node dopt-run starts no replacement once rank 0's port refuses connections",
          "[replace][multiprocess]") {
  // Two nodes of two ranks (two dopt-runs): rank 0 listens on MASTER_PORT
  // for HOLD seconds (as a rank 0 does for its whole job), rank 2 (node 1)
  // kills itself after DIE seconds, ranks 1 and 3 run for 3.5 s; node 1's
  // dopt-run cannot see rank 0's process, only its port. A replacement just
  // says so and exits 0.
  struct Case {
    std::string hold, die;
    bool replaced;
  };
  const Case c = GENERATE(Case{"5", "1.5", true}, Case{"0.3", "2.5", false});
  INFO("rank 0 listens for " << c.hold << " s, rank 2 dies after " << c.die << " s");
  const std::string port = std::to_string(free_port());
  const std::string program =
      "if [ -n \"$DOPT_REPLACES\" ]; then echo \"replacement of rank $RANK\"; exit 0; fi; "
      "if [ \"$RANK\" = 0 ]; then exec python3 -c 'import os, socket, time; s = socket.socket(); "
      "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((\"127.0.0.1\", "
      "int(os.environ[\"MASTER_PORT\"]))); s.listen(8); time.sleep(" +
      c.hold + ")'; fi; if [ \"$RANK\" = 2 ]; then sleep " + c.die + "; kill -9 $$; fi; sleep 3.5";
  std::vector<Proc> nodes;
  for (const char* node : {"0", "1"})
    nodes.push_back(
        start({kDoptRun, "--on-failure", "replace", "--nnodes", "2", "--node-rank", node, "--nproc-per-node", "2",
               "--master-addr", "127.0.0.1", "--master-port", port, "/bin/sh", "-c", program},
              {{"DOPT_JOB_ID", "replace-two-nodes"}}));
  const Done node0 = wait(nodes[0]), node1 = wait(nodes[1]);
  INFO("node 0: " << node0.out << "node 1: " << node1.out);
  CHECK(node0.ok());
  CHECK(node1.ok());  // rank 3 finished; rank 2's replacement did, or rank 2 was lost
  CHECK(contains(node1.out, "dopt-run: rank 2 killed by signal 9 (SIGKILL)"));
  if (c.replaced) {
    check_has(node1.out, {"starting its replacement (incarnation 1", "[rank 2] replacement of rank 2"});
  } else {
    check_has(node1.out, {"the other ranks continue (--on-failure replace: rank 0's port 127.0.0.1:" + port +
                          " refuses connections, a replacement would find no job to join)"});
    CHECK_FALSE(contains(node1.out, "starting its replacement"));
  }
}

TEST_CASE("replace: grow() between processes with no newcomer coming times out, and the world goes on (shm, tcp)",
          "[replace][multiprocess]") {
  const std::string transport = GENERATE(std::string("shm"), std::string("tcp"));
  INFO("DOPT_TRANSPORT=" << transport);
  const Done d = run_through_dopt_run(kDoptRun, kGrowPeer, 3, {"refused"},
                                      {{"DOPT_TIMEOUT_MS", "30000"}, {"DOPT_TRANSPORT", transport}});
  INFO(d.out);
  CHECK(d.ok());
  require_all_ok(d.out, 3, 6);  // grow({.newcomers = 2}) refused at once among them
}

TEST_CASE("replace: on the hierarchical plane grow() refuses, naming the plane and what works instead",
          "[replace][multiprocess]") {
  // 2 "hosts" (DOPT_HOST_ID) of 2 ranks: the world runs on the hier plane.
  const Done d = run_replacing({}, 4, kTwoHosts + "exec " + kGrowPeer + " refused", {{"DOPT_DEBUG", "1"}});
  INFO(d.out);
  CHECK(d.ok());
  check_has(d.out, {"runs on the hier plane"});
  require_all_ok(d.out, 4, 6);
}

TEST_CASE("replace: on the hierarchical plane the replacement joins the survivors' group, which grows on the actor plane",
          "[replace][multiprocess]") {
  // 2 "hosts" (DOPT_HOST_ID) of 2 ranks: the world runs on the hier plane.
  // Rank 1 kills itself; ranks 0, 2 and 3 shrink (a group with 1 and 2
  // members on the hosts: the actor plane) and grow() by one; rank 1's
  // replacement (on host0 again) joins with a TCP mesh of its own, which
  // the survivors' meshes connect to; all four sum RANK + 1, in 8 floats
  // and in 1 MiB (tests/grow_peer.cpp, mode grown).
  const Done d = run_replacing({"--max-replacements", "1"}, 4, kTwoHosts + "exec " + kGrowPeer + " grown 1 0",
                               {{"DOPT_DEBUG", "1"}});
  INFO(d.out);
  CHECK(d.ok());
  check_has(d.out, {"runs on the hier plane",
                    "dopt-run: rank 1 killed by signal 9 (SIGKILL); starting its replacement (incarnation 1",
                    "[rank 0] ok 0 6", "[rank 1] ok 1 4", "[rank 2] ok 2 6", "[rank 3] ok 3 6"});
  CHECK_FALSE(contains(d.out, "error "));
}

TEST_CASE("replace: a replacement without the job's secret is refused, and the survivors go on",
          "[replace][multiprocess]") {
  // The job's secret comes from the environment (dopt-run passes it on); the
  // replacement presents another one. It checks rank 0's proof first, and
  // neither side gives its secret away.
  replacement_refused("DOPT_SECRET=not-the-jobs-secret-0123456789 ",
                      {{"DOPT_SECRET", "the-jobs-own-secret-0123456789"}},
                      {"[rank 1] error AuthenticationError: ", "could not prove that it knows this job's secret"});
}

namespace {

/// Rank 1 kills itself; ranks 0 and 2 shrink, then grow() by one; rank 1's
/// replacement joins through join_group(); all three sum RANK + 1, in 8
/// floats and in 1 MiB (tests/grow_peer.cpp, mode grown) with DOPT_TRANSPORT
/// `transport`. The survivors shrink at once (grow() then waits for the
/// replacement), or 1.5 s later (it waits for them, and shrink() must still
/// see the loss).
void check_grown(const std::string& transport) {
  const std::string wait_ms = GENERATE(std::string("0"), std::string("1500"));
  INFO("DOPT_TRANSPORT=" << transport << ", the survivors shrink after " << wait_ms << " ms");
  const Done d = run_replacing({"--max-replacements", "1"}, 3, "exec " + kGrowPeer + " grown 1 " + wait_ms,
                               {{"DOPT_TRANSPORT", transport}, {"DOPT_DEBUG", "1"}});
  INFO(d.out);
  CHECK(d.ok());
  check_has(d.out, {"dopt-run: rank 1 killed by signal 9 (SIGKILL); starting its replacement (incarnation 1",
                    "[rank 0] ok 0 6", "[rank 1] ok 1 4", "[rank 2] ok 2 6",
                    "the world group runs on the " + std::string(transport == "tcp" ? "tcp" : "shm") + " plane"});
  CHECK_FALSE(contains(d.out, "error "));
}

}  // namespace

TEST_CASE("replace: on the actor plane the replacement joins, the survivors grow, and the grown group all_reduces",
          "[replace][multiprocess]") {
  // 1 MiB goes over the TCP mesh: the survivors' meshes connect to the
  // replacement's when it joins.
  check_grown("tcp");
}

TEST_CASE("replace: on the shm plane the replacement joins, the survivors grow, and the grown group all_reduces",
          "[replace][multiprocess]") {
  // The grown group runs on new shared-memory regions, the replacement's
  // among them (its process id came with the meeting).
  check_grown("shm");
}

namespace {

/// 5 ranks train ZeRO (Adam) with DOPT_TRANSPORT `transport`; rank 2 kills
/// itself before step 2's gradients; the others recover (its shard from the
/// buddy copy) and train steps 2 and 3 over 4 ranks; before step 4 they
/// grow() and catch the replacement up (zero_catch_up); all train to step 7
/// and compare their parameters bitwise with a reference run of a plain Adam
/// over the mean gradients of the ranks that contributed to each step
/// (tests/zero_grow_peer.cpp). With the parameters as views of ZeRO's
/// buckets, and without.
void check_zero_grown(const std::string& transport) {
  const std::string bucket_view = GENERATE(std::string(""), std::string(" bucket_view"));
  INFO("DOPT_TRANSPORT=" << transport << " dopt_zero_grow_peer 2 2 4 7" << bucket_view);
  const Done d = run_replacing({"--max-replacements", "1"}, 5, "exec " + kZeroGrowPeer + " 2 2 4 7" + bucket_view,
                               {{"DOPT_TRANSPORT", transport}});
  INFO(d.out);
  CHECK(d.ok());
  check_has(d.out, {"dopt-run: rank 2 killed by signal 9 (SIGKILL); starting its replacement (incarnation 1",
                    "[rank 0] ok 0 32", "[rank 1] ok 1 32", "[rank 2] ok 2 31", "[rank 3] ok 3 32",
                    "[rank 4] ok 4 32"});
  CHECK_FALSE(contains(d.out, "error "));
}

}  // namespace

TEST_CASE("replace: ZeRO (redundancy 1) loses a rank at step 2, its replacement joins at step 4, bitwise the reference",
          "[replace][multiprocess]") {
  check_zero_grown("tcp");
}

TEST_CASE("replace: on the shm plane ZeRO (redundancy 1) grows back at step 4, bitwise the reference",
          "[replace][multiprocess]") {
  check_zero_grown("shm");
}

namespace {

/// Rank 1 is lost 10 times in a row (DOPT_TRANSPORT `transport`): each
/// incarnation below 10 kills itself after its group's all_reduce; ranks 0
/// and 2 shrink, grow and check the grown group (8 floats and 1 MiB) each
/// time; the 10th replacement stays and all three check the last group
/// (tests/grow_peer.cpp, mode cycles). Every process prints its pid:
/// afterwards /dev/shm holds no name that one of them made (other tests
/// running alongside may make their own).
void check_cycles(const std::string& transport) {
  const std::set<std::string> before = dopt_shm_names();
  const Done d = run_replacing({"--max-replacements", "10"}, 3, "echo \"pid $$\"; exec " + kGrowPeer + " cycles 1 10",
                               {{"DOPT_TRANSPORT", transport}});
  INFO(d.out);
  CHECK(d.ok());
  check_has(d.out, {"starting its replacement (incarnation 10, --on-failure replace)",
                    "dopt-run: 10 replacement(s) started (ranks 1, 1, 1, 1, 1, 1, 1, 1, 1, 1)", "[rank 0] ok 0 71",
                    "[rank 1] ok 1 5", "[rank 2] ok 2 71"});
  CHECK_FALSE(contains(d.out, "incarnation 11"));
  CHECK_FALSE(contains(d.out, "error "));
  const std::vector<std::string> pids = printed_pids(d.out);
  CHECK(pids.size() == 13);  // 3 first starts and 10 replacements
  for (const std::string& name : dopt_shm_names()) {
    if (before.count(name)) continue;
    for (const std::string& pid : pids) {
      INFO("left in /dev/shm: " << name);
      CHECK(name.rfind("dopt-" + pid + "-", 0) != 0);
    }
  }
}

}  // namespace

TEST_CASE("replace: 10 kill-and-replace cycles in one run of dopt-run --on-failure replace leave /dev/shm clean",
          "[replace][multiprocess]") {
  check_cycles("tcp");
}

TEST_CASE("replace: on the shm plane 10 kill-and-replace cycles leave /dev/shm clean", "[replace][multiprocess]") {
  check_cycles("shm");
}

TEST_CASE("replace: a replacement whose members end without growing fails join_group() at once, not at its timeout",
          "[replace][multiprocess]") {
  // Rank 1 kills itself; ranks 0 and 2 shrink, see its replacement wait
  // (newcomers_waiting) and end; its join_group(), with a 30 s timeout,
  // fails within 10 s with PeerLostError saying the job ended
  // (tests/grow_peer.cpp, mode abandoned).
  const std::string transport = GENERATE(std::string("shm"), std::string("tcp"));
  INFO("DOPT_TRANSPORT=" << transport);
  const Done d = run_replacing({"--max-replacements", "1"}, 3, "exec " + kGrowPeer + " abandoned 1",
                               {{"DOPT_TRANSPORT", transport}});
  INFO(d.out);
  CHECK(d.ok());
  check_has(d.out, {"dopt-run: rank 1 killed by signal 9 (SIGKILL); starting its replacement (incarnation 1",
                    "[rank 0] ok 0 3", "[rank 1] ok 1 5", "[rank 2] ok 2 3"});
  CHECK_FALSE(contains(d.out, "error "));
}

TEST_CASE("replace: SIGTERM (dopt-run's stop) ends a dopt-train replacement waiting in join_group() at once",
          "[replace][multiprocess]") {
  // Ranks 0 and 2 are tests/grow_peer.cpp (mode abandoned, holding 20 s):
  // after rank 1's loss they shrink, see its replacement wait and never
  // grow. The replacement is dopt-train --optim zero --survive, waiting in
  // join_group() (30 s timeout). dopt-run gets SIGTERM once it waits: the
  // replacement ends with exit code 130 well within the grace period (8 s,
  // then SIGKILL), and nothing of its process stays in /dev/shm.
  const std::string program =
      "echo \"pid $$\"; if [ -n \"$DOPT_REPLACES\" ]; then exec " + std::string(DOPT_BINARY_DIR) +
      "/tools/dopt-train --optim zero --survive --steps 50; fi; " + "exec " + kGrowPeer + " abandoned 1 20000";
  const Proc p = start({kDoptRun, "--on-failure", "replace", "--max-replacements", "1", "--grace", "8",
                        "--nproc-per-node", "3", "--master-port", "0", "/bin/sh", "-c", program},
                       {{"DOPT_TIMEOUT_MS", "30000"}});
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!contains(slurp(p.out_path), "replacement waiting") && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::this_thread::sleep_for(std::chrono::seconds(1));  // from init_process_group into join_group()
  const auto stop = std::chrono::steady_clock::now();
  REQUIRE(::kill(p.pid, SIGTERM) == 0);
  const Done d = wait(p);
  const auto took = std::chrono::steady_clock::now() - stop;
  INFO(d.out);
  check_has(d.out, {"starting its replacement (incarnation 1", "replacement waiting",
                    "[rank 1] dopt-train: stopped by a signal while this replacement waited in join_group() to "
                    "rejoin the job",
                    "dopt-run: rank 1 stopped: exit code 130"});
  CHECK(took < std::chrono::seconds(5));
  const std::vector<std::string> pids = printed_pids(d.out);
  CHECK(pids.size() == 4);  // 3 first starts and the replacement
  for (const std::string& name : dopt_shm_names())
    for (const std::string& pid : pids) {
      INFO("left in /dev/shm: " << name);
      CHECK(name.rfind("dopt-" + pid + "-", 0) != 0);
    }
}

namespace {

/// Rank 1 of 3 started by hand as a replacement (DOPT_REPLACES=1,
/// incarnation 1) of tests/grow_peer.cpp (mode grown: it calls join_group)
/// whose rank 0 is at 127.0.0.1:`port`, with a 30 s handshake timeout.
Proc start_replacement_by_hand(int port) {
  auto env = rank_env(1, 3, port);
  env.insert({{"DOPT_REPLACES", "1"},
              {"DOPT_INCARNATION", "1"},
              {"DOPT_HANDSHAKE_TIMEOUT_MS", "30000"},
              {"DOPT_SECRET", "the-jobs-own-secret-0123456789"}});
  return start({kGrowPeer, "grown", "1", "0"}, env);
}

/// The elapsed_ms a rank program printed with its error (peer_main.hpp), -1 without one.
long elapsed_ms(const std::string& out) {
  const auto at = out.find("elapsed_ms ");
  return at == std::string::npos ? -1 : std::stol(out.substr(at + 11));
}

}  // namespace

TEST_CASE("replace: a replacement whose rank 0 is gone fails at once, not after the handshake timeout",
          "[replace][multiprocess]") {
  // Nothing listens at rank 0's port any more (the job ended, or rank 0 was
  // lost): rank 0 listened there for the whole job, so the refusal is final.
  const Done d = wait(start_replacement_by_hand(free_port()));
  INFO(d.out);
  CHECK(d.failed());
  check_has(d.out, {"error PeerLostError: init_process_group [rank 1]: this process replaces lost rank 1 "
                    "(incarnation 1, ",
                    "but rank 0's rendezvous did not take it: rank 0 at 127.0.0.1:",
                    "refused the connection (Connection refused): the job's rank 0 is gone (the job ended, or rank 0 "
                    "was lost)"});
  const long ms = elapsed_ms(d.out);
  CHECK(ms >= 0);
  CHECK(ms < 10000);  // the handshake timeout is 30 s
}

TEST_CASE("replace: a replacement ended by SIGTERM while it waits for rank 0 leaves nothing in /dev/shm",
          "[replace][multiprocess]") {
  // Rank 0's port takes the connection (the listen backlog) and never
  // answers: the replacement waits in init_process_group (up to the 30 s
  // handshake timeout) until SIGTERM (dopt-run's stop) ends it; what it
  // made in /dev/shm ("dopt-<pid>-...", its host probe among them) is gone.
  const Listener rank0;
  const Proc p = start_replacement_by_hand(rank0.port);
  pollfd pending{rank0.fd, POLLIN, 0};  // its connection waits in the backlog: it measured its host before
  const bool connected = ::poll(&pending, 1, 10000) == 1;
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  REQUIRE(::kill(p.pid, SIGTERM) == 0);
  const Done d = wait(p);
  INFO(d.out);
  CHECK(connected);
  REQUIRE(WIFSIGNALED(d.status));
  CHECK(WTERMSIG(d.status) == SIGTERM);
  for (const std::string& name : dopt_shm_names()) {
    INFO("left in /dev/shm: " << name);
    CHECK(name.rfind("dopt-" + std::to_string(p.pid) + "-", 0) != 0);
  }
}

namespace {

/// Whitespace of `text` (a Markdown page) as single spaces.
std::string one_line(const std::string& text) {
  std::string out;
  for (char c : text) {
    const bool space = c == '\n' || c == ' ';
    if (!space)
      out += c;
    else if (!out.empty() && out.back() != ' ')
      out += ' ';
  }
  return out;
}

}  // namespace

TEST_CASE("continue: dopt-run's exit status under --on-failure continue is the one both pages state",
          "[replace][multiprocess]") {
  // Three shell ranks end in rank order as `ends` says: rank R > 0 starts
  // its ending only once rank R - 1's process is gone (reaped by dopt-run),
  // so the order holds under any load.
  struct Case {
    std::string what, ends;
    int status;
  };
  const Case c = GENERATE(
      Case{"a rank left (75), the others finished", "[ $RANK = 1 ] && exit 75; exit 0", 0},
      Case{"every rank left (75): nobody finished", "exit 75", 75},
      Case{"the first failed rank was killed, the others left (75)", "[ $RANK = 0 ] && kill -9 $$; exit 75", 128 + 9},
      Case{"a rank left (75), a later one failed with an error of its own (4)",
           "[ $RANK = 1 ] && exit 75; [ $RANK = 2 ] && exit 4; exit 0", 4});
  INFO(c.what);
  static int runs = 0;
  const TempDir dir("dopt-continue-status", std::to_string(runs++));
  const std::string d_ = dir.path.string();
  const std::string in_order = "if [ $RANK -gt 0 ]; then while [ ! -f " + d_ + "/$((RANK - 1)) ]; do sleep 0.02; done; " +
                               "while kill -0 $(cat " + d_ + "/$((RANK - 1))) 2>/dev/null; do sleep 0.02; done; fi; " +
                               "echo $$ > " + d_ + "/$RANK.part && mv " + d_ + "/$RANK.part " + d_ + "/$RANK; ";
  const Done d = wait(start({kDoptRun, "--on-failure", "continue", "--nproc-per-node", "3", "--master-port", "0",
                             "/bin/sh", "-c", in_order + c.ends},
                            {}));
  INFO(d.out);
  REQUIRE(WIFEXITED(d.status));
  CHECK(WEXITSTATUS(d.status) == c.status);
  // docs/launching.md and docs/fault-tolerance-tools.md state the same rule.
  for (const char* page : {"docs/launching.md", "docs/fault-tolerance-tools.md"}) {
    INFO(page);
    const std::string text = one_line(slurp(std::string(DOPT_SOURCE_DIR) + "/" + page));
    for (const char* rule : {"exit status is then the exit code of the first failed rank that exited with a non-zero "
                             "code other than 75 (an error of its own",
                             "else 0 when some rank finished; else, when no rank finished, 75 if the first failed "
                             "rank left the job with exit code 75",
                             "or `128 + S` if it was killed by signal S."})
      CHECK(contains(text, rule));
  }
}

TEST_CASE(
    "replace: an elastic world of 3 (2 start) and of 5 (3 start), started by hand: the newcomers of the vacant "
    "slots join one at a time and the group grows to every rank (tcp, shm)",
    "[replace][multiprocess]") {
  const std::string transport = GENERATE("auto", "shm");
  for (const auto& [n, min] : std::vector<std::pair<int, int>>{{3, 2}, {5, 3}}) {
    INFO("DOPT_TRANSPORT=" << transport << ", world " << n << ", " << min << " start it");
    const int port = free_port();
    std::vector<Proc> ps;
    // Every process at once: the newcomers wait until the world is up.
    for (int r = 0; r < n; ++r) {
      auto e = rank_env(r, n, port);
      e["DOPT_MIN_WORLD_SIZE"] = std::to_string(min);
      e["DOPT_TRANSPORT"] = transport;
      e["DOPT_SECRET"] = "the-elastic-worlds-secret-0123456789";
      if (r >= min) {
        e["DOPT_REPLACES"] = std::to_string(r);
        e["DOPT_INCARNATION"] = "1";
      }
      ps.push_back(start({kGrowPeer, "elastic"}, e));
    }
    for (int r = 0; r < n; ++r) {
      const Done d = wait(ps[static_cast<std::size_t>(r)]);
      INFO("rank " << r << ": " << d.out);
      CHECK(d.ok());
      CHECK(contains(d.out, "ok " + std::to_string(r) + " "));
      CHECK_FALSE(contains(d.out, "error"));
    }
  }
}

namespace {

/// Waits (at most `seconds`) until `p`'s output holds `text`.
bool output_holds(const Proc& p, const std::string& text, int seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  for (;;) {
    if (contains(slurp(p.out_path), text)) return true;
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace

TEST_CASE(
    "replace: newcomers of an elastic world with another DOPT_MIN_WORLD_SIZE or WORLD_SIZE are refused at once "
    "naming it, and one that fails after its admission holds the next one back no longer",
    "[replace][multiprocess]") {
  // A world of 4 that ranks 0 and 1 start (tests/grow_peer.cpp, elastic: the
  // members grow until every slot is taken, 30 s at most). The newcomers
  // come one after the other, each once the one before ended (or joined).
  const int port = free_port();
  auto env_of = [port](int rank, int world, const std::string& min, const std::string& incarnation) {
    auto e = rank_env(rank, world, port);
    e["DOPT_MIN_WORLD_SIZE"] = min;
    e["DOPT_SECRET"] = "the-elastic-worlds-secret-0123456789";
    e["DOPT_HANDSHAKE_TIMEOUT_MS"] = "5000";  // rank 0 holds the others back 10 s after it admitted a newcomer
    if (!incarnation.empty()) {
      e["DOPT_REPLACES"] = std::to_string(rank);
      e["DOPT_INCARNATION"] = incarnation;
    }
    return e;
  };
  std::vector<Proc> members;
  for (int r = 0; r < 2; ++r) members.push_back(start({kGrowPeer, "elastic"}, env_of(r, 4, "2", "")));
  struct Newcomer {
    std::string what;
    std::map<std::string, std::string> env;
    std::string says;
  };
  auto mpi = env_of(2, 4, "2", "1");
  mpi["DOPT_BACKEND"] = "mpi";
  const std::vector<Newcomer> refused{
      {"another DOPT_MIN_WORLD_SIZE", env_of(2, 4, "1", "1"),
       "but rank 0 refused it: it was started with other settings than the running job (DOPT_MIN_WORLD_SIZE "
       "(dopt-run --nproc-per-node times --nnodes MIN): the job has 2, this node 1); start it with the job's settings"},
      {"another WORLD_SIZE", env_of(2, 5, "2", "1"),
       "but rank 0 refused it: it was started with other settings than the running job (WORLD_SIZE: the job has 4, "
       "this process 5); start it with the job's settings"},
      // Admitted to rank 2's slot, then it fails (a process cannot join on the mpi plane) and ends.
      {"admitted, then failed", mpi, "cannot join a running job on the mpi plane"}};
  for (const Newcomer& n : refused) {
    INFO(n.what);
    const auto t0 = std::chrono::steady_clock::now();
    const Done d = wait(start({kGrowPeer, "elastic"}, n.env));
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    INFO(d.out);
    CHECK_FALSE(d.ok());
    CHECK(contains(d.out, "error "));
    CHECK(contains(d.out, "init_process_group [rank 2]: this process takes rank 2's vacant slot (incarnation 1, "));
    CHECK(contains(d.out, n.says));
    CHECK(took < 10);  // at once, not after the job's timeout
  }
  // Rank 3's newcomer is admitted at once, not 10 s (two handshake
  // timeouts) after the failed one was; then rank 2's (incarnation 2: the
  // failed one's 1 was admitted).
  const auto t0 = std::chrono::steady_clock::now();
  const Proc rank3 = start({kGrowPeer, "elastic"}, env_of(3, 4, "2", "1"));
  const bool joined = output_holds(rank3, "joined 3", 20);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const Proc rank2 = start({kGrowPeer, "elastic"}, env_of(2, 4, "2", "2"));
  CHECK(joined);
  CHECK(took < 7);
  std::vector<Done> done{wait(members[0]), wait(members[1]), wait(rank2), wait(rank3)};
  for (int r = 0; r < 4; ++r) {
    const Done& d = done[static_cast<std::size_t>(r)];
    INFO("rank " << r << ": " << d.out);
    CHECK(d.ok());
    CHECK(contains(d.out, "ok " + std::to_string(r) + " "));
    CHECK_FALSE(contains(d.out, "error"));
  }
}

TEST_CASE(
    "replace: a late node's newcomer whose rank 0 never listens fails after DOPT_TIMEOUT_MS naming the address to "
    "check",
    "[replace][multiprocess]") {
  auto late_env = [](int port) {
    auto e = rank_env(2, 3, port);
    e["DOPT_MIN_WORLD_SIZE"] = "2";
    e["DOPT_SECRET"] = "the-elastic-worlds-secret-0123456789";
    e["DOPT_REPLACES"] = "2";
    e["DOPT_INCARNATION"] = "1";
    e["DOPT_HANDSHAKE_TIMEOUT_MS"] = "1000";
    e["DOPT_TIMEOUT_MS"] = "4000";
    return e;
  };
  // Nobody listens: the job's timeout (4 s, above three handshake timeouts), then an error naming what to check.
  const auto t0 = std::chrono::steady_clock::now();
  const Done d = wait(start({kGrowPeer, "elastic"}, late_env(free_port())));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(d.out);
  CHECK_FALSE(d.ok());
  CHECK(contains(d.out, "did not listen within 4000 ms (DOPT_TIMEOUT_MS"));
  CHECK(contains(d.out, "--master-addr and --master-port"));
  CHECK(s >= 3.5);
  CHECK(s < 30.0);
}

namespace {

const std::string kLocalSgdGrowPeer = std::string(DOPT_BINARY_DIR) + "/tests/dopt_local_sgd_grow_peer";

/// 5 ranks train post-local SGD (`mode` plsgd: Adam, averages at steps 1, 3,
/// 5, ...) or streaming DiLoCo (diloco: 2 fragments, delay 1) with
/// DOPT_TRANSPORT `transport`; rank 2 kills itself before step 2's
/// gradients; the survivors notice it at step 3 (plsgd: the average shrinks
/// in step(); diloco: step 2's prepare failed, step 3's sync puts that
/// fragment back and the survivors rebuild over the shrunk group); before
/// step JOIN_AT (4: nothing in flight; 5: for DiLoCo, fragment 0 prepared by
/// the survivors is in flight) they grow() and post_local_sgd_catch_up(),
/// while the replacement join_group()s and catches up from group rank 0; all
/// train to step 10 and compare their parameters bitwise with a reference
/// every process computes for every rank (tests/local_sgd_grow_peer.cpp).
void check_local_sgd_grown(const std::string& mode, const std::string& transport) {
  const std::string join_at = GENERATE(std::string("4"), std::string("5"));
  const std::string args = mode + " 2 2 " + join_at + " 10";
  INFO("DOPT_TRANSPORT=" << transport << " dopt_local_sgd_grow_peer " << args);
  const Done d = run_replacing({"--max-replacements", "1"}, 5, "exec " + kLocalSgdGrowPeer + " " + args,
                               {{"DOPT_TRANSPORT", transport}});
  INFO(d.out);
  CHECK(d.ok());
  // The checks each process made: post-local SGD's members one more (the
  // MembershipChangedError names the victim).
  const std::string member = mode == "plsgd" ? "23" : "22";
  check_has(d.out, {"dopt-run: rank 2 killed by signal 9 (SIGKILL); starting its replacement (incarnation 1",
                    "[rank 0] ok 0 " + member, "[rank 1] ok 1 " + member, "[rank 2] ok 2 22", "[rank 3] ok 3 " + member,
                    "[rank 4] ok 4 " + member});
  CHECK_FALSE(contains(d.out, "error "));
}

}  // namespace

TEST_CASE("replace: post-local SGD loses a rank at step 2, its replacement joins at step 4 or 5, bitwise the reference",
          "[replace][multiprocess]") {
  check_local_sgd_grown("plsgd", "shm");
}

TEST_CASE("replace: on the actor plane post-local SGD grows back at step 4 or 5, bitwise the reference",
          "[replace][multiprocess]") {
  check_local_sgd_grown("plsgd", "tcp");
}

TEST_CASE("replace: DiLoCo loses a rank at step 2, its replacement joins at step 4 or 5, bitwise the reference",
          "[replace][multiprocess]") {
  check_local_sgd_grown("diloco", "shm");
}

TEST_CASE("replace: on the actor plane DiLoCo grows back with and without a fragment in flight, bitwise the reference",
          "[replace][multiprocess]") {
  check_local_sgd_grown("diloco", "tcp");
}

TEST_CASE("replace: DiLoCo's replacement built with another sync_every: every process raises ValueError naming it",
          "[replace][multiprocess]") {
  const Done d = run_replacing({"--max-replacements", "1"}, 5, "exec " + kLocalSgdGrowPeer + " diloco-other-h 2 2 4 10");
  INFO(d.out);
  CHECK_FALSE(d.ok());
  for (int r = 0; r < 5; ++r)
    CHECK(contains(d.out, "[rank " + std::to_string(r) + "] error ValueError: post_local_sgd_catch_up [rank " +
                              std::to_string(r) + "]: the ranks' DiLoCoAverager settings differ (global ranks): "
                              "sync_every: ranks 0-1, 3-4 have 4, rank 2 has 8"));
  CHECK_FALSE(contains(d.out, "TimeoutError"));
}

TEST_CASE("replace: HierarchicalModelAverager loses a rank at step 2, its replacement joins at step 4 or 5, the levels "
          "rebuilt over the grown group, bitwise the reference (shm, tcp)",
          "[replace][multiprocess]") {
  // The survivors see the loss at step 2's barrier and rebuild their
  // optimizer over the shrunk group (tests/local_sgd_grow_peer.cpp).
  check_local_sgd_grown("hierarchical", GENERATE(std::string("shm"), std::string("tcp")));
}

TEST_CASE("replace: ZeRO without redundancy resumes the step 2 checkpoint, grows back at step 4, bitwise the reference",
          "[replace][multiprocess]") {
  // Redundancy 0: the victim's shard has no copy (recover() has nothing to
  // take it from). Every rank save_sharded()s at each step boundary; the
  // survivors shrink(), build a ZeRO over the shrunk group and load_sharded()
  // the checkpoint of step 2 (5 shards, loaded at 4 ranks), then train and
  // grow back as with redundancy 1 (tests/zero_grow_peer.cpp, checkpoint DIR).
  const std::string transport = GENERATE(std::string("shm"), std::string("tcp"));
  const TempDir dir("dopt-replace-zero-r0", transport);
  const std::string args = "2 2 4 7 checkpoint " + dir.path.string();
  INFO("DOPT_TRANSPORT=" << transport << " dopt_zero_grow_peer " << args);
  const Done d = run_replacing({"--max-replacements", "1"}, 5, "exec " + kZeroGrowPeer + " " + args,
                               {{"DOPT_TRANSPORT", transport}});
  INFO(d.out);
  CHECK(d.ok());
  check_has(d.out,
            {"dopt-run: rank 2 killed by signal 9 (SIGKILL); starting its replacement (incarnation 1",
             "[rank 0] ok 0 33", "[rank 1] ok 1 33", "[rank 2] ok 2 31", "[rank 3] ok 3 33", "[rank 4] ok 4 33"});
  CHECK_FALSE(contains(d.out, "error "));
  CHECK(std::filesystem::exists(dir.path / "step-2-of-4"));  // the survivors trained steps 2 and 3 at 4 ranks
}
