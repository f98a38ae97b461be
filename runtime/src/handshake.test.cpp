// dopt::net's handshake: the protocol on its own, over real loopback sockets
// (AuthListener + connect_authenticated), and inside TcpMesh.
#include "dopt/runtime/internal/handshake.hpp"

#include <catch2/catch.hpp>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "dopt/runtime/error.hpp"
#include "dopt/runtime/notice.hpp"
#include "dopt/runtime/internal/tcp_transport.hpp"

using namespace dopt;
using namespace dopt::net;
using namespace std::chrono_literals;

namespace {

Credentials creds(std::string job, std::string secret, int rank = 0, int world = 2) {
  Credentials c;
  c.job_id = std::move(job);
  c.secret = std::move(secret);
  c.rank = rank;
  c.world_size = world;
  return c;
}

const std::string kSecret = "0123456789abcdef-job-secret";

/// Runs the four steps in memory; returns "" or "<ErrorType>: message" of the
/// client, and the server's refusal in *server_refusal.
std::string run(Purpose cp, const Credentials& c, Purpose sp, const Credentials& s, Admit admit = {},
                std::string* server_refusal = nullptr, PeerHello* seen = nullptr) {
  ClientHandshake client(cp, c, "rank 0 at test:1", "test");
  ServerHandshake server(sp, s, std::move(admit));
  try {
    const std::string reply = server.on_hello(client.hello());
    const std::string proof = client.on_reply(reply);
    const std::string verdict = server.on_proof(proof);
    if (server_refusal) *server_refusal = server.refusal();
    if (seen) *seen = server.peer();
    client.on_verdict(verdict);
    CHECK(server.admitted());
    return "";
  } catch (const AuthenticationError& e) {
    if (server_refusal) *server_refusal = server.refusal();
    return std::string("AuthenticationError: ") + e.what();
  } catch (const ValueError& e) {
    if (server_refusal) *server_refusal = server.refusal();
    return std::string("ValueError: ") + e.what();
  }
}

/// A plain TCP connection to 127.0.0.1:port (REQUIREd to succeed).
int dial(int port) {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  return s;
}

struct CaptureNotices {
  std::mutex m;
  std::vector<std::string> notes;
  NoticeHandler old;
  CaptureNotices() {
    old = set_notice_handler([this](const std::string& t) {
      std::lock_guard<std::mutex> l(m);
      notes.push_back(t);
    });
  }
  ~CaptureNotices() { set_notice_handler(old); }
  std::vector<std::string> get() {
    std::lock_guard<std::mutex> l(m);
    return notes;
  }
};

}  // namespace

TEST_CASE("handshake: the same job and secret pass, the server learns who connected", "[handshake][security]") {
  PeerHello seen;
  CHECK(run(Purpose::rendezvous, creds("A", kSecret, 3, 5), Purpose::rendezvous, creds("A", kSecret, 0, 5), {}, nullptr,
            &seen) == "");
  CHECK(seen.rank == 3);
  CHECK(seen.world_size == 5);
  CHECK(seen.job_id == "A");
  CHECK(seen.purpose == Purpose::rendezvous);
  CHECK(run(Purpose::control, creds("", ""), Purpose::control, creds("", "")) == "");  // no job id, no secret
}

TEST_CASE("handshake: another job, a missing or wrong secret, the wrong port are refused with the reason",
          "[handshake][security]") {
  std::string refusal;
  CHECK(run(Purpose::rendezvous, creds("B", ""), Purpose::rendezvous, creds("A", ""), {}, &refusal) ==
        "ValueError: test [rank 0]: rank 0 at test:1 belongs to another job than this process (job 'B'): two "
        "jobs use the same address and port (give each job its own MASTER_PORT, or the same DOPT_JOB_ID if they are "
        "one job)");
  CHECK(refusal == "this port belongs to job 'A', the connecting process to job 'B'");  // the server's own note
  CHECK_THAT(run(Purpose::rendezvous, creds("", ""), Purpose::rendezvous, creds("A", "")),
             Catch::Contains("belongs to another job than this process (no job id)"));

  CHECK_THAT(run(Purpose::control, creds("A", ""), Purpose::control, creds("A", kSecret), {}, &refusal),
             Catch::StartsWith("AuthenticationError: test [rank 0]: rank 0 at test:1 refused this process: this port "
                               "requires its job's secret and the connecting process has none"));
  // The same secret and another job id: told after the proof, as another job.
  CHECK_THAT(run(Purpose::control, creds("B", kSecret), Purpose::control, creds("A", kSecret), {}, &refusal),
             Catch::StartsWith("ValueError: test [rank 0]: rank 0 at test:1 belongs to another job than this process "
                               "(job 'B') that has the same secret"));
  CHECK(refusal == "this port belongs to job 'A', the connecting process to job 'B'");
  CHECK_THAT(run(Purpose::control, creds("A", kSecret), Purpose::control, creds("A", "")),
             Catch::Contains("the connecting process has a secret but this one has none"));
  CHECK(run(Purpose::control, creds("A", kSecret + "x"), Purpose::control, creds("A", kSecret), {}, &refusal) ==
        "AuthenticationError: test [rank 0]: rank 0 at test:1 could not prove that it knows this job's secret: "
        "refusing it (a process of another job, or a different DOPT_SECRET_FILE?)");

  CHECK_THAT(run(Purpose::rendezvous, creds("A", ""), Purpose::control, creds("A", "")),
             Catch::EndsWith("refused this process: this is a control port of rank 0, not the rendezvous"));
  const Admit closed = [](const PeerHello& p) {
    return "the world is already closed: rank " + std::to_string(p.rank) + " is already taken";
  };
  CHECK_THAT(run(Purpose::rendezvous, creds("A", kSecret, 1), Purpose::rendezvous, creds("A", kSecret), closed, &refusal),
             Catch::EndsWith("refused this process: the world is already closed: rank 1 is already taken"));
}

TEST_CASE("handshake: a refused process learns nothing of the job: not its id, rank or world size",
          "[handshake][security]") {
  // What a stranger would need to pass the job-id check (docs/launching.md,
  // "Who may join"): never in the bytes it gets back.
  const std::string job = "job-id-a-stranger-must-not-learn";
  // Without a secret the job id is the only check: another id is refused at once.
  for (const Credentials& stranger : {creds("guess", ""), creds("", "")}) {
    ClientHandshake client(Purpose::rendezvous, stranger, "p", "test");
    ServerHandshake server(Purpose::rendezvous, creds(job, "", 3, 7), {});
    const std::string reply = server.on_hello(client.hello());
    REQUIRE(server.refused());
    CHECK(reply.find(job) == std::string::npos);
    CHECK(reply.find("job-id") == std::string::npos);
    CHECK(server.refusal().find(job) != std::string::npos);  // the server's note names it
    // Rank and world size: -1 and 0, not 3 and 7.
    CHECK(reply.substr(12, 8) == std::string("\xff\xff\xff\xff\0\0\0\0", 8));
    std::string error;
    try {
      (void)client.on_reply(reply);
    } catch (const Error& e) {
      error = e.what();
    }
    CHECK_THAT(error, Catch::Contains("belongs to another job than this process"));
    CHECK(error.find(job) == std::string::npos);
  }
  // With a secret, a process without it gets the same bytes whether the job
  // id it guessed is right or not: nothing tells it that a guess was right.
  std::vector<std::string> replies;
  for (const std::string& guess : {std::string("guess"), std::string(), job}) {
    ClientHandshake client(Purpose::rendezvous, creds(guess, ""), "p", "test");
    ServerHandshake server(Purpose::rendezvous, creds(job, kSecret, 3, 7), {});
    replies.push_back(server.on_hello(client.hello()));
    CHECK(server.refused());
    CHECK(replies.back().find(job) == std::string::npos);
    CHECK(replies.back().substr(12, 8) == std::string("\xff\xff\xff\xff\0\0\0\0", 8));
  }
  CHECK(replies[0] == replies[1]);
  CHECK(replies[0] == replies[2]);
  // A process with a wrong secret: the challenge it gets holds no rank, world
  // size or job id, and the verdict on its proof is the same for a right and
  // a wrong job id.
  std::vector<std::string> verdicts;
  for (const std::string& guess : {std::string("guess"), job}) {
    ClientHandshake client(Purpose::rendezvous, creds(guess, kSecret + "-other"), "p", "test");
    ServerHandshake server(Purpose::rendezvous, creds(job, kSecret, 3, 7), {});
    const std::string reply = server.on_hello(client.hello());
    CHECK_FALSE(server.refused());
    CHECK(reply.find(job) == std::string::npos);
    CHECK(reply.substr(12, 8) == std::string("\xff\xff\xff\xff\0\0\0\0", 8));
    verdicts.push_back(server.on_proof(std::string(kProofSize, 'x')));
    CHECK_FALSE(server.admitted());
  }
  CHECK(verdicts[0] == verdicts[1]);
}

namespace {

/// 100 connections stall against a listener that keeps 64 handshakes at
/// once (`stall(fd)` makes one stall); then a rank connects and must be
/// admitted at once, not after the stalled ones' 20 s. Returns the
/// listener's first note.
std::string rank_gets_in_past_stallers(const std::function<void(int)>& stall) {
  CaptureNotices notes;
  std::mutex m;
  int admitted = 0;
  AuthListener::Options o;
  o.purpose = Purpose::control;
  o.credentials = creds("A", kSecret);
  o.handshake_timeout = 20s;  // the stalled ones would hold their place that long
  o.what = "the test listener";
  o.on_ready = [&](int fd, const PeerHello&) {
    std::lock_guard<std::mutex> lk(m);
    ++admitted;
    ::close(fd);
  };
  AuthListener l(o);
  std::vector<int> stalled;
  for (int k = 0; k < 100; ++k) {
    const int s = dial(l.port());
    stall(s);
    stalled.push_back(s);
  }
  std::this_thread::sleep_for(300ms);
  const auto t0 = std::chrono::steady_clock::now();
  RetryLater retry;
  auto fd = connect_authenticated("127.0.0.1", l.port(), Purpose::control, creds("A", kSecret, 1), 5s,
                                  std::chrono::steady_clock::now() + 5s, "rank 0", "test", &retry);
  REQUIRE(fd);
  ::close(*fd);
  CHECK(std::chrono::steady_clock::now() - t0 < 2s);
  // on_ready runs on the listener's thread once its verdict is written.
  for (int k = 0; k < 200; ++k) {
    {
      std::lock_guard<std::mutex> lk(m);
      if (admitted == 1) break;
    }
    std::this_thread::sleep_for(5ms);
  }
  {
    std::lock_guard<std::mutex> lk(m);
    CHECK(admitted == 1);
  }
  for (int s : stalled) ::close(s);
  l.close();
  const auto n = notes.get();
  REQUIRE_FALSE(n.empty());
  return n[0];
}

}  // namespace

TEST_CASE("handshake over sockets: connections that send nothing, or a byte at a time, cannot keep a rank out",
          "[handshake][security]") {
  // Each sends 3 bytes of a hello and stalls.
  const std::string note = rank_gets_in_past_stallers([](int s) { REQUIRE(::write(s, "dop", 3) == 3); });
  CHECK_THAT(note, Catch::Matches("refused a connection from 127\\.0\\.0\\.1:[0-9]+ to the test listener: it sent no "
                                  "complete handshake while 64 connections were waiting \\(closed to make room\\)"));
}

TEST_CASE("handshake over sockets: connections that send their hello and never their proof cannot keep a rank out",
          "[handshake][security]") {
  // Each knows the job id, sends a whole hello, reads the listener's
  // challenge (before the next one connects, so that every earlier one is
  // waiting for its proof when a newcomer arrives) and never answers it.
  const std::string note = rank_gets_in_past_stallers([](int s) {
    const std::string hello = ClientHandshake(Purpose::control, creds("A", kSecret + "-guess"), "p", "t").hello();
    REQUIRE(::write(s, hello.data(), hello.size()) == static_cast<ssize_t>(hello.size()));
    std::string reply(kReplySize, '\0');
    for (std::size_t got = 0; got < reply.size();) {
      const ssize_t r = ::read(s, reply.data() + got, reply.size() - got);
      REQUIRE(r > 0);
      got += static_cast<std::size_t>(r);
    }
  });
  CHECK_THAT(note, Catch::Matches("refused a connection from 127\\.0\\.0\\.1:[0-9]+ to the test listener: it sent its "
                                  "hello but no proof while 64 connections were waiting \\(closed to make room\\)"));
}

TEST_CASE("handshake: a hello of any other size is refused without reading past it (found by fuzzing)",
          "[handshake][security]") {
  // fuzz/handshake.cpp found the server reading the hello's fields before
  // checking its size (regression input: fuzz/corpus/handshake/regress-short-hello).
  ClientHandshake client(Purpose::control, creds("A", ""), "p", "test");
  const std::string hello = client.hello();
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, kMagicSize, std::size_t{17}, std::size_t{25}, kHelloSize - 1,
                        kHelloSize + 1, 2 * kHelloSize}) {
    INFO(n << " bytes");
    std::string h = n <= hello.size() ? hello.substr(0, n) : hello + std::string(n - hello.size(), 'x');
    ServerHandshake server(Purpose::control, creds("A", ""), {});
    const std::string reply = server.on_hello(h);
    CHECK(reply.size() == kReplySize);
    CHECK(server.refused());
    CHECK(server.refusal() == "not a dopt handshake");
  }
}

TEST_CASE("handshake: a client that does not know the secret fails the server's check", "[handshake][security]") {
  // A client that forges the proof (it cannot compute the HMAC) is refused
  // after step 3, before anything else is accepted.
  ClientHandshake client(Purpose::control, creds("A", kSecret), "p", "test");
  ServerHandshake server(Purpose::control, creds("A", kSecret), {});
  const std::string reply = server.on_hello(client.hello());
  REQUIRE_FALSE(server.refused());
  const std::string verdict = server.on_proof(std::string(kProofSize, 'x'));
  CHECK_FALSE(server.admitted());
  CHECK(server.refusal() == "authentication failed: the connecting process does not know this job's secret");
  CHECK_THROWS_AS(client.on_verdict(verdict), AuthenticationError);
  // Replaying an earlier proof against a fresh server nonce fails too.
  ClientHandshake c2(Purpose::control, creds("A", kSecret), "p", "test");
  ServerHandshake s1(Purpose::control, creds("A", kSecret), {}), s2(Purpose::control, creds("A", kSecret), {});
  const std::string proof1 = c2.on_reply(s1.on_hello(c2.hello()));
  (void)s1.on_proof(proof1);
  CHECK(s1.admitted());
  (void)s2.on_hello(c2.hello());
  (void)s2.on_proof(proof1);
  CHECK_FALSE(s2.admitted());
}

TEST_CASE("handshake over sockets: AuthListener hands over authenticated connections only", "[handshake][security]") {
  CaptureNotices notes;
  std::mutex m;
  std::vector<PeerHello> ready;
  std::vector<int> fds;
  AuthListener::Options o;
  o.bind_addr = "127.0.0.1";
  o.purpose = Purpose::control;
  o.credentials = creds("A", kSecret, 0, 3);
  o.handshake_timeout = 500ms;
  o.what = "the test listener";
  o.on_ready = [&](int fd, const PeerHello& p) {
    std::lock_guard<std::mutex> l(m);
    ready.push_back(p);
    fds.push_back(fd);
  };
  AuthListener l(o);
  REQUIRE(l.port() > 0);
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  RetryLater retry;
  auto fd = connect_authenticated("127.0.0.1", l.port(), Purpose::control, creds("A", kSecret, 2, 3), 2s, deadline,
                                  "rank 0", "test", &retry);
  REQUIRE(fd);
  CHECK(*fd >= 0);
  ::close(*fd);
  CHECK_THROWS_WITH(connect_authenticated("127.0.0.1", l.port(), Purpose::control, creds("A", "wrong-secret-0123456"),
                                          2s, deadline, "rank 0", "test", &retry),
                    Catch::Contains("rank 0 could not prove that it knows this job's secret"));
  CHECK_THROWS_AS(connect_authenticated("127.0.0.1", l.port(), Purpose::control, creds("A", ""), 2s, deadline, "rank 0",
                                        "test", &retry),
                  AuthenticationError);
  CHECK_THROWS_AS(connect_authenticated("127.0.0.1", l.port(), Purpose::control, creds("B", kSecret), 2s, deadline,
                                        "rank 0", "test", &retry),
                  ValueError);
  // Garbage: dropped after the first 8 bytes.
  {
    const int s = dial(l.port());
    const char junk[] = "GET / HTTP/1.0\r\n\r\n";
    REQUIRE(::write(s, junk, sizeof junk - 1) > 0);
    char c;
    CHECK(::read(s, &c, 1) <= 0);  // closed (or reset) by the listener
    ::close(s);
  }
  {
    std::lock_guard<std::mutex> lk(m);
    REQUIRE(ready.size() == 1);
    CHECK(ready[0].rank == 2);
    for (int f : fds) ::close(f);
  }
  l.close();
  const auto n = notes.get();
  REQUIRE(n.size() >= 4);
  CHECK_THAT(n[0], Catch::StartsWith("refused a connection from 127.0.0.1:"));
  // The client with the wrong secret rejects the listener's proof first and leaves.
  CHECK_THAT(n[0], Catch::EndsWith("to the test listener: the connecting process left during the handshake (it did not "
                                   "accept this side's proof: another job's secret?)"));
  CHECK_THAT(n[1], Catch::EndsWith("to the test listener: this port requires its job's secret and the connecting process "
                                   "has none (set DOPT_SECRET_FILE or DOPT_SECRET as for the other ranks)"));
  CHECK_THAT(n[2], Catch::EndsWith("to the test listener: this port belongs to job 'A', the connecting process to job 'B'"));  // the listener's own note may name its job
  CHECK_THAT(n[3], Catch::EndsWith("to the test listener: not a dopt handshake"));
  // Closed: nobody listens any more.
  retry = {};
  CHECK_FALSE(connect_authenticated("127.0.0.1", l.port(), Purpose::control, creds("A", kSecret), 1s,
                                    std::chrono::steady_clock::now() + 1s, "rank 0", "test", &retry));
  CHECK(retry.reason == "Connection refused");
}

TEST_CASE("handshake over sockets: a port that accepts and never answers is a TimeoutError after the handshake timeout",
          "[handshake][security]") {
  // A listening socket that never accepts: the kernel completes the
  // connection from its backlog, and nothing ever answers.
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::listen(s, 4) == 0);
  socklen_t len = sizeof a;
  REQUIRE(::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  const int port = ntohs(a.sin_port);
  RetryLater retry;
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(connect_authenticated("127.0.0.1", port, Purpose::rendezvous, creds("A", ""), 300ms, t0 + 10s,
                                          "rank 0 at 127.0.0.1:" + std::to_string(port), "rendezvous", &retry),
                    Catch::Contains("rank 0 at 127.0.0.1:" + std::to_string(port) +
                                    " accepted the connection but did not answer dopt's handshake within 300 ms"));
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(secs >= 0.25);
  CHECK(secs < 2.0);
  ::close(s);
}

TEST_CASE("handshake: TcpMesh ranks with different secrets do not connect", "[handshake][security]") {
  using dopt::transport::TcpMesh;
  using dopt::transport::TcpMeshOptions;
  CaptureNotices notes;
  auto l0 = TcpMesh::listen("127.0.0.1");
  auto l1 = TcpMesh::listen("127.0.0.1");
  const std::vector<std::string> eps{"127.0.0.1:" + std::to_string(l0.port()), "127.0.0.1:" + std::to_string(l1.port())};
  TcpMeshOptions o0, o1;
  o0.credentials = creds("A", kSecret);
  o1.credentials = creds("A", "another-secret-of-16");
  auto f0 = std::async(std::launch::async, [&] { TcpMesh m(0, 2, std::move(l0), eps, 1500ms, o0); });
  auto f1 = std::async(std::launch::async, [&] { TcpMesh m(1, 2, std::move(l1), eps, 1500ms, o1); });
  CHECK_THROWS_WITH(f0.get(), Catch::Contains("rank 1 at " + eps[1] + " could not prove that it knows this job's secret"));
  CHECK_THROWS_AS(f1.get(), TimeoutError);  // it never heard from a rank that proved itself
  // and the same credentials connect
  auto m0 = TcpMesh::listen("127.0.0.1");
  auto m1 = TcpMesh::listen("127.0.0.1");
  const std::vector<std::string> eps2{"127.0.0.1:" + std::to_string(m0.port()), "127.0.0.1:" + std::to_string(m1.port())};
  o1.credentials = o0.credentials;
  auto g0 = std::async(std::launch::async, [&] { TcpMesh m(0, 2, std::move(m0), eps2, 5s, o0); });
  auto g1 = std::async(std::launch::async, [&] { TcpMesh m(1, 2, std::move(m1), eps2, 5s, o1); });
  CHECK_NOTHROW(g0.get());
  CHECK_NOTHROW(g1.get());
}

TEST_CASE("handshake: the bind address follows DOPT_BIND_ADDR, DOPT_SOCKET_IFNAME or MASTER_ADDR",
          "[handshake][security]") {
  LaunchEnv env;
  env.master_addr = "127.0.0.1";
  BindPlan p = choose_bind_address(env);
  CHECK(p.bind == "127.0.0.1");
  CHECK(p.advertise == "127.0.0.1");
  CHECK_FALSE(p.wildcard);
  env.master_addr = "localhost";
  CHECK(choose_bind_address(env).bind.rfind("127.", 0) == 0);
  env.bind_addr = "0.0.0.0";
  p = choose_bind_address(env);
  CHECK(p.wildcard);
  CHECK(p.advertise != "0.0.0.0");  // the host name
  env.advertise_addr = "node7";
  CHECK(choose_bind_address(env).advertise == "node7");
  env = LaunchEnv{};
  env.socket_ifname = "lo";
  CHECK(choose_bind_address(env).bind == "127.0.0.1");
  env.socket_ifname = "no-such-if0";
  CHECK_THROWS_WITH(choose_bind_address(env), Catch::Contains("DOPT_SOCKET_IFNAME=no-such-if0 is not a network interface"));
}

TEST_CASE("handshake: listeners take their ports from DOPT_PORT_RANGE, and say so when it is full",
          "[handshake][network]") {
  CHECK(listen_ports(0, 0, 0) == std::vector<int>{0});
  CHECK(listen_ports(29500, 30000, 30009) == std::vector<int>{29500});
  auto ps = listen_ports(0, 30000, 30009);
  REQUIRE(ps.size() == 10);
  std::sort(ps.begin(), ps.end());
  for (int i = 0; i < 10; ++i) CHECK(ps[static_cast<std::size_t>(i)] == 30000 + i);
  // a range of two free ports: two listeners fit, the third is told
  int lo = 0;
  for (int base = 41000; base < 60000 && !lo; base += 7) {
    dopt::transport::TcpListener a, b;
    try {
      a = dopt::transport::TcpMesh::listen("127.0.0.1", base, base);
      b = dopt::transport::TcpMesh::listen("127.0.0.1", base + 1, base + 1);
    } catch (const IOError&) {
      continue;
    }
    lo = base;
  }
  REQUIRE(lo > 0);
  AuthListener::Options o;
  o.bind_addr = "127.0.0.1";
  o.port_lo = lo;
  o.port_hi = lo + 1;
  o.on_ready = [](int fd, const PeerHello&) { ::close(fd); };
  AuthListener first(o);
  CHECK((first.port() == lo || first.port() == lo + 1));
  auto second = dopt::transport::TcpMesh::listen("127.0.0.1", lo, lo + 1);
  CHECK(second.port() == (first.port() == lo ? lo + 1 : lo));
  CHECK_THROWS_WITH(AuthListener(o), Catch::Contains("no free port in DOPT_PORT_RANGE=" + std::to_string(lo) + "-" +
                                                     std::to_string(lo + 1) + " on 127.0.0.1"));
  CHECK_THROWS_WITH(dopt::transport::TcpMesh::listen("127.0.0.1", lo, lo + 1),
                    Catch::Contains("no free port in DOPT_PORT_RANGE"));
}

TEST_CASE("handshake: IPv6 loopback binds and advertises ::1, every interface advertises the route to MASTER_ADDR",
          "[handshake][network]") {
  LaunchEnv env;
  env.master_addr = "::1";
  BindPlan p = choose_bind_address(env);
  CHECK(p.bind == "::1");
  CHECK(p.advertise == "::1");
  env.bind_addr = "::";
  CHECK(choose_bind_address(env).wildcard);
  env = LaunchEnv{};
  env.master_addr = "127.0.0.2";  // not the loopback address itself: still loopback
  env.bind_addr = "0.0.0.0";
  CHECK_FALSE(choose_bind_address(env).advertise.empty());
}

TEST_CASE("handshake: a loopback MASTER_ADDR binds the address it names, a host name that is loopback here binds every "
          "interface when the job spans hosts (torchrun's c10d rendezvous)",
          "[handshake][network]") {
  LaunchEnv env;
  env.master_addr = "127.0.0.2";  // rank 0 must listen where the others dial
  BindPlan p = choose_bind_address(env);
  CHECK(p.bind == "127.0.0.2");
  CHECK(p.advertise == "127.0.0.2");
  env.world_size = 4;  // two hosts of 2 ranks: a written address is kept
  env.local_world_size = 2;
  CHECK(choose_bind_address(env).bind == "127.0.0.2");
  env.master_addr = "localhost";  // "localhost" means this machine: kept too
  p = choose_bind_address(env);
  CHECK_FALSE(p.wildcard);
  CHECK((p.bind.rfind("127.", 0) == 0 || p.bind == "::1"));
  // This host's own name (torchrun's c10d agent sets MASTER_ADDR so), when it
  // is loopback here (/etc/hosts: 127.0.0.1 or Debian's 127.0.1.1).
  char name[256] = {};
  REQUIRE(::gethostname(name, sizeof name - 1) == 0);
  LaunchEnv one;
  one.master_addr = name;
  const BindPlan alone = choose_bind_address(one);
  if (alone.bind.rfind("127.", 0) != 0 && alone.bind != "::1") {
    WARN("this host's name '" << name << "' is not loopback here (bind " << alone.bind << "): not checked");
    return;
  }
  CHECK_FALSE(alone.wildcard);  // one host: stays on the loopback address the name has
  one.world_size = 4;
  one.local_world_size = 2;
  p = choose_bind_address(one);
  CHECK(p.wildcard);
  CHECK((p.bind == "0.0.0.0" || p.bind == "::"));
  CHECK(p.advertise == name);  // the other hosts resolve it to this host's address
}
