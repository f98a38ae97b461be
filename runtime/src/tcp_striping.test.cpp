// TcpMesh's striping of large messages over several data connections per peer
// pair: N meshes in one process on 127.0.0.1, one thread per rank for setup.
#include <catch2/catch.hpp>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dopt/runtime/error.hpp"
#include "dopt/runtime/internal/parallel.hpp"
#include "dopt/runtime/internal/tcp_transport.hpp"
#include "completions.hpp"
#include "loopback_mesh.hpp"
#include "tcp_settings.hpp"

using namespace dopt::transport;
using namespace dopt::testing;
using namespace std::chrono_literals;

namespace {

TcpMeshOptions striped(int streams, std::size_t stripe_min) {
  TcpMeshOptions o;
  o.streams = streams;
  o.stripe_min_bytes = stripe_min;
  return o;
}

// Every rank's construction, as a future (so a test can look at each rank's error).
std::vector<std::future<std::unique_ptr<TcpMesh>>> start_meshes(int n, std::vector<TcpMeshOptions> opts,
                                                                 std::chrono::milliseconds timeout = 20s) {
  std::vector<TcpListener> ls;
  std::vector<std::string> eps;
  for (int r = 0; r < n; ++r) {
    ls.push_back(TcpMesh::listen("127.0.0.1"));
    eps.push_back("127.0.0.1:" + std::to_string(ls.back().port()));
  }
  opts.resize(n);
  std::vector<std::future<std::unique_ptr<TcpMesh>>> fs;
  for (int r = 0; r < n; ++r)
    fs.push_back(std::async(std::launch::async, [l = std::move(ls[r]), eps, o = opts[r], r, n, timeout]() mutable {
      return std::make_unique<TcpMesh>(r, n, std::move(l), eps, timeout, o);
    }));
  return fs;
}

// n meshes, every rank with options o.
Meshes make_meshes(int n, TcpMeshOptions o) {
  return dopt::testing::loopback_meshes(n, std::vector<TcpMeshOptions>(std::size_t(n), o));
}

// Every rank sends every size to every other rank on two tags, alternating;
// half of the recvs are posted before the sends (received in place), half
// after (buffered); checks every byte.
void exchange(Meshes& ms, const std::vector<std::size_t>& sizes) {
  const int n = int(ms.size());
  struct Msg {
    int a, b;
    Tag tag;
    std::vector<unsigned char> sent, got;
  };
  std::vector<Msg> msgs;
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b)
      if (a != b)
        for (std::size_t k = 0; k < sizes.size(); ++k)
          msgs.push_back(Msg{a, b, Tag{7, k % 2}, pattern(sizes[k], unsigned(a * 100 + b * 10 + k)),
                             std::vector<unsigned char>(sizes[k], 0)});
  Waiter w;
  for (std::size_t i = 0; i < msgs.size(); i += 2)
    ms[msgs[i].b]->recv(msgs[i].a, msgs[i].tag, msgs[i].got.data(), msgs[i].got.size(), w.cb());
  for (auto& m : msgs) ms[m.a]->send(m.b, m.tag, m.sent.data(), m.sent.size(), w.cb());
  for (std::size_t i = 1; i < msgs.size(); i += 2)
    ms[msgs[i].b]->recv(msgs[i].a, msgs[i].tag, msgs[i].got.data(), msgs[i].got.size(), w.cb());
  w.wait_ok();
  for (auto& m : msgs) {
    INFO("from " << m.a << " to " << m.b << ", " << m.sent.size() << " bytes");
    CHECK(m.got == m.sent);
  }
}

}  // namespace

TEST_CASE("tcp striping: uneven sizes arrive intact, in order per tag", "[tcp][striping]") {
  // stripe_min 1000 with 3 streams: 999 travels whole, 1000 in one piece,
  // 2999 in two, the others in three pieces of unequal length.
  auto ms = make_meshes(3, striped(3, 1000));
  for (auto& m : ms) CHECK(m->streams() == 3);
  exchange(ms, {0, 1, 999, 1000, 1001, 2999, 3001, 65537, (std::size_t(3) << 20) + 7, 13});
}

TEST_CASE("tcp striping: more streams than pieces", "[tcp][striping]") {
  // 8 data connections; a message of 100 KiB is one piece, 200 KiB three:
  // most connections stay idle for each message, and the order still holds.
  auto ms = make_meshes(2, striped(8, 64 << 10));
  exchange(ms, {100 << 10, 5, 200 << 10, (64 << 10) - 1, 64 << 10, (std::size_t(8) << 20) + 3});
}

TEST_CASE("tcp striping: none (streams 0) still works, and 5 ranks with the default", "[tcp][striping]") {
  auto ms = make_meshes(2, striped(0, 1));
  CHECK(ms[0]->streams() == 0);
  exchange(ms, {0, 1, 1 << 20});
  auto ms5 = make_meshes(5, TcpMeshOptions{});
  exchange(ms5, {4096, (std::size_t(1) << 20) + 1});
}

TEST_CASE("tcp striping: a size mismatch fails that recv only", "[tcp][striping]") {
  auto ms = make_meshes(2, striped(2, 1024));
  auto big = pattern(1 << 20, 1), next = pattern(300000, 2);
  std::vector<unsigned char> small(4096), got(next.size());
  Waiter w, w2;
  ms[1]->recv(0, Tag{1, 1}, small.data(), small.size(), w.cb());  // posted: pieces dropped
  ms[0]->send(1, Tag{1, 1}, big.data(), big.size(), w2.cb());
  ms[0]->send(1, Tag{1, 1}, next.data(), next.size(), w2.cb());
  ms[0]->send(1, Tag{1, 1}, big.data(), big.size(), w2.cb());
  w2.wait_ok();
  auto e = w.wait();
  REQUIRE(e[0]);
  CHECK(is<dopt::CollectiveMismatchError>(e[0]));
  Waiter w3, w4;
  ms[1]->recv(0, Tag{1, 1}, got.data(), got.size(), w3.cb());
  w3.wait_ok();
  CHECK(got == next);
  ms[1]->recv(0, Tag{1, 1}, small.data(), small.size(), w4.cb());  // buffered: fails too
  auto e4 = w4.wait();
  REQUIRE(e4[0]);
  CHECK(is<dopt::CollectiveMismatchError>(e4[0]));
  // The connections are still in step.
  Waiter w5;
  ms[1]->recv(0, Tag{2, 0}, got.data(), got.size(), w5.cb());
  ms[0]->send(1, Tag{2, 0}, next.data(), next.size(), w5.cb());
  w5.wait_ok();
  CHECK(got == next);
}

TEST_CASE("tcp striping: a peer closing mid-message fails the recv with PeerLostError", "[tcp][striping]") {
  auto ms = make_meshes(2, striped(2, 64 << 10));
  std::vector<unsigned char> big(std::size_t(64) << 20, 1), got(big.size());
  Waiter recv, send;
  ms[1]->recv(0, Tag{3, 0}, got.data(), got.size(), recv.cb());
  // Rank 1's I/O thread is held: it does not read the message's header, so
  // its data connections read nothing and the sender stalls once the socket
  // buffers (a few MiB) are full, in the middle of the 64 MiB.
  std::promise<void> release;
  auto released = release.get_future().share();
  ms[1]->post([released] { released.wait_for(10s); });
  ms[0]->send(1, Tag{3, 0}, big.data(), big.size(), send.cb());
  std::this_thread::sleep_for(300ms);
  ms[0]->close();  // rank 0 goes away mid-message
  auto es = send.wait();
  REQUIRE(es[0]);
  CHECK(is<dopt::StateError>(es[0]));  // it was not all handed to the kernel
  release.set_value();
  auto er = recv.wait(30s);  // bounded: a hang fails here
  REQUIRE(er[0]);
  CHECK(is<dopt::PeerLostError>(er[0]));
  CHECK_THAT(message_of(er[0]), Catch::Contains("connection to rank 0 lost"));
  CHECK(ms[1]->peer_lost(0));
}

TEST_CASE("tcp striping: every rank must use the same number of streams", "[tcp][striping]") {
  auto fs = start_meshes(2, {striped(2, 1024), striped(3, 1024)}, 5s);
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r);
    try {
      fs[std::size_t(r)].get();
      FAIL("constructed");
    } catch (const dopt::IOError& e) {
      CHECK_THAT(e.what(), Catch::Contains("DOPT_TCP_STREAMS"));
      CHECK_THAT(e.what(), Catch::Contains("every rank must use the same number"));
    }
  }
}

TEST_CASE("tcp striping: settings from the environment", "[tcp][striping]") {
  auto with_env = [](const char* name, const char* value, auto fn) {
    ::setenv(name, value, 1);
    try {
      fn();
    } catch (...) {
      ::unsetenv(name);
      throw;
    }
    ::unsetenv(name);
  };
  with_env("DOPT_TCP_STREAMS", "3", [] {
    auto ms = make_meshes(2, TcpMeshOptions{});
    CHECK(ms[0]->streams() == 3);
    exchange(ms, {std::size_t(1) << 20});
  });
  with_env("DOPT_TCP_STRIPE_MIN", "4K", [] {
    auto ms = make_meshes(2, striped(4, 0));
    exchange(ms, {4095, 4096, 16385});
  });
  with_env("DOPT_TCP_SOCKET_BUFFER", "1MiB", [] {
    auto ms = make_meshes(2, striped(2, 0));
    exchange(ms, {std::size_t(2) << 20});
  });
  for (const char* bad : {"many", "17", "-1", "2x"})
    with_env("DOPT_TCP_STREAMS", bad, [bad] {
      INFO(bad);
      CHECK_THROWS_WITH(TcpMesh(0, 1, TcpMesh::listen("127.0.0.1"), {"127.0.0.1:1"}, 1s),
                        Catch::Contains("DOPT_TCP_STREAMS"));
    });
}

TEST_CASE("tcp striping: by default only where the process may run on 4 CPUs", "[tcp][striping]") {
  ::unsetenv("DOPT_TCP_STRIPE_MIN");
  TcpMeshOptions o;
  dopt::transport::tcp_detail::resolve_settings(o, 0);
  if (dopt::hardware_threads() >= 4) {
    CHECK(o.stripe_min_bytes == 256u * 1024u);
  } else {
    CHECK(o.stripe_min_bytes >= (std::size_t(1) << 62));  // no message is that large: all travel whole
  }
  ::setenv("DOPT_TCP_STRIPE_MIN", "1M", 1);
  TcpMeshOptions e;
  dopt::transport::tcp_detail::resolve_settings(e, 0);
  ::unsetenv("DOPT_TCP_STRIPE_MIN");
  CHECK(e.stripe_min_bytes == std::size_t(1) << 20);  // the variable decides either way
  TcpMeshOptions given = striped(2, 4096);
  dopt::transport::tcp_detail::resolve_settings(given, 0);
  CHECK(given.stripe_min_bytes == 4096);
}
