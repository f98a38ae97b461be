// TcpMesh: N meshes in one process on 127.0.0.1, one thread per rank for setup.
#include "dopt/runtime/internal/tcp_transport.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <condition_variable>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "dopt/runtime/error.hpp"
#include "dopt/runtime/internal/parallel.hpp"
#include "completions.hpp"
#include "loopback_mesh.hpp"

using namespace dopt::transport;
using namespace dopt::testing;
using namespace std::chrono_literals;

TEST_CASE("tcp mesh: a world of one has no peers", "[tcp]") {
  auto ms = loopback_meshes(1);
  CHECK(ms[0]->world_size() == 1);
  CHECK_THROWS_AS(ms[0]->send(0, nullptr, 0, [](std::exception_ptr) {}), dopt::ValueError);
  std::promise<bool> ran;
  ms[0]->post([&] { ran.set_value(ms[0]->in_io_thread()); });
  CHECK(ran.get_future().get());
  CHECK_FALSE(ms[0]->in_io_thread());
}

TEST_CASE("tcp mesh: messages of every size arrive intact between every pair", "[tcp]") {
  for (int n : {2, 3, 5}) {
    auto ms = loopback_meshes(n);
    const std::vector<std::size_t> sizes = {0, 1, 7, 4096, 65537, (std::size_t(5) << 20) + 3};
    // data[src][dst][k]
    std::vector<std::vector<std::vector<std::vector<unsigned char>>>> sent(n), got(n);
    Waiter w;
    for (int a = 0; a < n; ++a) {
      sent[a].resize(n);
      got[a].resize(n);
      for (int b = 0; b < n; ++b) {
        if (a == b) continue;
        for (std::size_t k = 0; k < sizes.size(); ++k) {
          sent[a][b].push_back(pattern(sizes[k], unsigned(a * 100 + b * 10 + k)));
          got[a][b].emplace_back(sizes[k], 0);
        }
      }
    }
    // Receivers post half of their recvs before the sends and half after, so both
    // the direct and the buffered path are taken.
    for (int a = 0; a < n; ++a)
      for (int b = 0; b < n; ++b)
        if (a != b)
          for (std::size_t k = 0; k < sizes.size() / 2; ++k)
            ms[b]->recv(a, Tag{1, 2}, got[a][b][k].data(), sizes[k], w.cb());
    for (int a = 0; a < n; ++a)
      for (int b = 0; b < n; ++b)
        if (a != b)
          for (std::size_t k = 0; k < sizes.size(); ++k)
            ms[a]->send(b, Tag{1, 2}, sent[a][b][k].data(), sizes[k], w.cb());
    for (int a = 0; a < n; ++a)
      for (int b = 0; b < n; ++b)
        if (a != b)
          for (std::size_t k = sizes.size() / 2; k < sizes.size(); ++k)
            ms[b]->recv(a, Tag{1, 2}, got[a][b][k].data(), sizes[k], w.cb());
    w.wait_ok();
    for (int a = 0; a < n; ++a)
      for (int b = 0; b < n; ++b)
        if (a != b) CHECK(got[a][b] == sent[a][b]);
  }
}

TEST_CASE("tcp mesh: messages that arrive before their recv are read into reused buffers", "[tcp]") {
  TcpMeshOptions o;
  o.streams = 0;  // every message on the one connection, in order
  const std::size_t n = std::size_t(1) << 20;
  // 1 MiB on tag 1, then 8 bytes on tag 2, received tag 2 first: once that
  // completes, the 1 MiB has been read whole, into an early buffer.
  auto early_round = [&](Meshes& ms, unsigned seed) {
    const auto data = pattern(n, seed);
    std::vector<unsigned char> got(n, 0);
    std::uint64_t small = seed, small_got = 0;
    Waiter w;
    ms[0]->send(1, Tag{9, 1}, data.data(), n, w.cb());
    ms[0]->send(1, Tag{9, 2}, &small, 8, w.cb());
    Waiter first;
    ms[1]->recv(0, Tag{9, 2}, &small_got, 8, first.cb());
    first.wait_ok();
    ms[1]->recv(0, Tag{9, 1}, got.data(), n, w.cb());
    w.wait_ok();
    CHECK(small_got == small);
    CHECK(got == data);
  };
  auto ms = loopback_meshes(2, std::vector<TcpMeshOptions>(2, o));
  for (unsigned round = 0; round < 3; ++round) {
    early_round(ms, round);
    // Its buffer went back to the receiver's pool, and served the next round.
    CHECK(ms[1]->buffers().free_bytes() == n);
  }
  TcpMeshOptions none = o;
  none.pool_bytes = 0;
  auto ns = loopback_meshes(2, std::vector<TcpMeshOptions>(2, none));
  early_round(ns, 7);
  CHECK(ns[1]->buffers().free_bytes() == 0);
}

TEST_CASE("tcp mesh: an I/O thread that polls delivers everything and closes", "[tcp]") {
  TcpMeshOptions o;
  o.poll_us = 200;
  auto ms = loopback_meshes(3, std::vector<TcpMeshOptions>(3, o));
  CHECK(ms[0]->poll_us() == 200);
  const std::vector<std::size_t> sizes = {0, 8, 65537, std::size_t(3) << 20};
  std::vector<std::vector<unsigned char>> sent, got;
  Waiter w;
  for (int a = 0; a < 3; ++a)
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      const int b = (a + 1) % 3;
      sent.push_back(pattern(sizes[k], unsigned(a * 10 + k)));
      got.emplace_back(sizes[k], 0);
      if (k % 2) ms[b]->recv(a, Tag{3, k}, got.back().data(), sizes[k], w.cb());  // posted first
      ms[a]->send(b, Tag{3, k}, sent.back().data(), sizes[k], w.cb());
      if (k % 2 == 0) {
        std::this_thread::sleep_for(1ms);  // an idle gap: the thread sleeps, then wakes for the next
        ms[b]->recv(a, Tag{3, k}, got.back().data(), sizes[k], w.cb());
      }
    }
  w.wait_ok();
  CHECK(got == sent);
  for (auto& m : ms) m->close();  // the polling loop ends
  // The default: poll only where each rank's two threads have CPUs of their own.
  const int cpus = dopt::hardware_threads();
  CHECK(TcpMesh::default_poll_us(1) == (cpus >= 2 ? 200 : 0));
  CHECK(TcpMesh::default_poll_us(cpus) == 0);
  ::setenv("DOPT_TCP_POLL_US", "50", 1);
  auto env = loopback_meshes(2);
  ::unsetenv("DOPT_TCP_POLL_US");
  CHECK(env[0]->poll_us() == 50);
  CHECK(loopback_meshes(2)[1]->poll_us() == 0);
  TcpMeshOptions hinted;  // the world's mesh says how many ranks share its host
  hinted.ranks_on_host = 1;
  CHECK(loopback_meshes(2, std::vector<TcpMeshOptions>(2, hinted))[0]->poll_us() == TcpMesh::default_poll_us(1));
}

TEST_CASE("tcp mesh: FIFO per tag, tags do not block each other", "[tcp]") {
  auto ms = loopback_meshes(2);
  constexpr int K = 500;
  std::vector<std::uint64_t> a(K), b(K), ra(K, 0), rb(K, 0);
  std::iota(a.begin(), a.end(), 1000);
  std::iota(b.begin(), b.end(), 5000);
  std::vector<std::uint32_t> aux(K, 0);
  Waiter w;
  for (int i = 0; i < K; ++i) {  // interleaved on the wire
    ms[0]->send(1, Tag{7, 1}, &a[i], 8, w.cb(), std::uint32_t(i + 1));
    ms[0]->send(1, Tag{7, 2}, &b[i], 8, w.cb());
  }
  // All of tag 2 first: tag 1's messages get buffered meanwhile.
  for (int i = 0; i < K; ++i) ms[1]->recv(0, Tag{7, 2}, &rb[i], 8, w.cb());
  for (int i = 0; i < K; ++i) ms[1]->recv(0, Tag{7, 1}, &ra[i], 8, w.cb(), &aux[i]);
  w.wait_ok();
  CHECK(ra == a);
  CHECK(rb == b);
  for (int i = 0; i < K; ++i) CHECK(aux[i] == std::uint32_t(i + 1));
}

TEST_CASE("tcp mesh: many operations in flight between five ranks", "[tcp]") {
  const int n = 5, K = 200;
  auto ms = loopback_meshes(n);
  std::vector<std::vector<std::uint32_t>> out(n * n, std::vector<std::uint32_t>(K)),
      in(n * n, std::vector<std::uint32_t>(K, 0));
  Waiter w;
  std::vector<std::thread> ts;
  for (int a = 0; a < n; ++a)
    ts.emplace_back([&, a] {  // each rank posts from its own thread
      for (int i = 0; i < K; ++i)
        for (int b = 0; b < n; ++b) {
          if (a == b) continue;
          out[a * n + b][i] = std::uint32_t(a * 1000000 + b * 1000 + i);
          ms[a]->send(b, Tag{3, std::uint64_t(i % 3)}, &out[a * n + b][i], 4, w.cb());
          ms[a]->recv(b, Tag{3, std::uint64_t(i % 3)}, &in[b * n + a][i], 4, w.cb());
        }
    });
  for (auto& t : ts) t.join();
  w.wait_ok();
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b)
      if (a != b) CHECK(in[a * n + b] == out[a * n + b]);
}

TEST_CASE("tcp mesh: a size mismatch fails that recv only", "[tcp]") {
  auto ms = loopback_meshes(2);
  std::vector<char> big(100, 'x'), small(10, 0);
  int v = 42, r = 0;
  Waiter ws;
  ms[0]->send(1, big.data(), big.size(), ws.cb());
  ms[0]->send(1, &v, sizeof v, ws.cb());
  ws.wait_ok();
  Waiter w1;
  ms[1]->recv(0, small.data(), small.size(), w1.cb());
  auto e = w1.wait();
  REQUIRE(e[0]);
  CHECK(is<dopt::CollectiveMismatchError>(e[0]));
  CHECK_THAT(message_of(e[0]), Catch::Contains("rank 0") && Catch::Contains("100 bytes"));
  Waiter w2;
  ms[1]->recv(0, &r, sizeof r, w2.cb());
  w2.wait_ok();
  CHECK(r == 42);
}

TEST_CASE("tcp mesh: a lost peer fails pending and later operations, naming it", "[tcp]") {
  std::mutex m;
  std::vector<int> lost_seen;
  std::vector<TcpMeshOptions> opts(3);
  opts[0].on_peer_lost = [&](int peer, std::exception_ptr) {
    std::lock_guard<std::mutex> l(m);
    lost_seen.push_back(peer);
  };
  auto ms = loopback_meshes(3, opts);
  std::vector<char> buf(1 << 20);
  Waiter pending;
  ms[0]->recv(2, buf.data(), buf.size(), pending.cb());
  ms[2]->close();  // rank 2 goes away with rank 0's recv outstanding
  auto e = pending.wait();
  REQUIRE(e[0]);
  CHECK(is<dopt::PeerLostError>(e[0]));
  CHECK_THAT(message_of(e[0]), Catch::Contains("connection to rank 2 lost"));
  CHECK(ms[0]->peer_lost(2));
  CHECK_FALSE(ms[0]->peer_lost(1));
  Waiter later;
  ms[0]->send(2, buf.data(), buf.size(), later.cb());
  ms[0]->recv(2, buf.data(), 8, later.cb());
  for (auto& x : later.wait()) {
    REQUIRE(x);
    CHECK(is<dopt::PeerLostError>(x));
    CHECK_THAT(message_of(x), Catch::Contains("rank 2"));
  }
  {
    std::lock_guard<std::mutex> l(m);
    CHECK(lost_seen == std::vector<int>{2});
  }
  // 0 <-> 1 still works.
  int v = 5, r = 0;
  Waiter ok;
  ms[0]->send(1, &v, sizeof v, ok.cb());
  ms[1]->recv(0, &r, sizeof r, ok.cb());
  ok.wait_ok();
  CHECK(r == 5);
}

TEST_CASE("tcp mesh: fail_peer breaks one connection on both sides", "[tcp]") {
  auto ms = loopback_meshes(2);
  char c = 0;
  Waiter w0, w1;
  ms[0]->recv(1, &c, 1, w0.cb());
  ms[1]->recv(0, &c, 1, w1.cb());
  ms[0]->fail_peer(1, "control plane timeout");
  auto e0 = w0.wait();
  REQUIRE(e0[0]);
  CHECK_THAT(message_of(e0[0]), Catch::Contains("control plane timeout"));
  auto e1 = w1.wait();
  REQUIRE(e1[0]);
  CHECK(is<dopt::PeerLostError>(e1[0]));
  CHECK_THAT(message_of(e1[0]), Catch::Contains("rank 0"));
}

TEST_CASE("tcp mesh: close fails pending operations and refuses new ones", "[tcp]") {
  auto ms = loopback_meshes(2);
  char c;
  Waiter w;
  std::atomic<bool> close_threw{false};
  ms[0]->recv(1, &c, 1, w.cb());
  ms[0]->recv(1, &c, 1, [&, cb = w.cb()](std::exception_ptr e) {
    try {
      ms[0]->close();  // from a callback: refused
    } catch (const dopt::StateError&) {
      close_threw = true;
    }
    cb(e);
  });
  ms[0]->close();
  for (auto& e : w.wait()) {
    REQUIRE(e);
    CHECK(is<dopt::StateError>(e));
  }
  CHECK(close_threw);
  CHECK_THROWS_AS(ms[0]->send(1, &c, 1, [](std::exception_ptr) {}), dopt::StateError);
  ms[0]->close();  // idempotent
  // The peer sees the end of the stream.
  Waiter w1;
  ms[1]->recv(0, &c, 1, w1.cb());
  auto e1 = w1.wait();
  REQUIRE(e1[0]);
  CHECK(is<dopt::PeerLostError>(e1[0]));
}

TEST_CASE("tcp mesh: a waiting thread drives the I/O itself", "[tcp][drive]") {
  auto ms = loopback_meshes(2);
  const auto me = std::this_thread::get_id();

  SECTION("the completions run on the driving thread, which returns once done") {
    const auto out = pattern(300000, 1);
    std::vector<unsigned char> in(out.size());
    std::atomic<int> done{0};
    std::thread::id ran_on;
    bool io_thread_seen = false;
    ms[1]->recv(0, Tag{3, 1}, in.data(), in.size(), [&](std::exception_ptr e) {
      ran_on = std::this_thread::get_id();
      io_thread_seen = ms[1]->in_io_thread();
      if (!e) done = 1;
      else done = 2;
    });
    // The message is sent once rank 1 drives (done() first runs then), so
    // that its completion cannot run on the I/O thread before the drive.
    Waiter sent;
    std::atomic<bool> driving{false};
    std::thread sender([&] {
      while (!driving) std::this_thread::yield();
      ms[0]->send(1, Tag{3, 1}, out.data(), out.size(), sent.cb());
    });
    const bool drove = ms[1]->drive(
        [&] {
          driving = true;
          return done.load() != 0;
        },
        [] {});
    sender.join();
    CHECK(drove);
    CHECK(done == 1);
    CHECK(ran_on == me);
    CHECK(io_thread_seen);
    CHECK(in == out);
    sent.wait_ok();
  }

  SECTION("one thread drives at a time; the others' operations complete through it") {
    std::atomic<bool> driving{false}, stop{false};
    std::thread::id driver;
    std::thread t([&] {
      driver = std::this_thread::get_id();
      ms[1]->drive(
          [&] {
            driving = true;
            return stop.load();
          },
          [] {});
    });
    while (!driving) std::this_thread::yield();
    CHECK_FALSE(ms[1]->drive([] { return false; }, [] {}));
    char a = 'x', b = 0;
    std::atomic<bool> got{false};
    std::thread::id ran_on;
    ms[1]->recv(0, Tag{3, 2}, &b, 1, [&](std::exception_ptr) {
      ran_on = std::this_thread::get_id();
      got = true;
    });
    Waiter sent;
    ms[0]->send(1, Tag{3, 2}, &a, 1, sent.cb());
    sent.wait_ok();
    const auto until = std::chrono::steady_clock::now() + 30s;
    while (!got && std::chrono::steady_clock::now() < until) std::this_thread::yield();
    stop = true;
    t.join();
    REQUIRE(got);
    CHECK(b == 'x');
    CHECK(ran_on == driver);
  }

  SECTION("not from a completion callback, not when turned off") {
    std::promise<bool> from_cb;
    ms[0]->post([&] { from_cb.set_value(ms[0]->drive([] { return true; }, [] {})); });
    CHECK_FALSE(from_cb.get_future().get());
    TcpMeshOptions off;
    off.caller_drives = 0;
    auto ns = loopback_meshes(2, {off, off});
    CHECK_FALSE(ns[0]->drive([] { return false; }, [] {}));
  }

  SECTION("an exception from check ends the drive; afterwards the I/O thread serves alone") {
    CHECK_THROWS_AS(ms[1]->drive([] { return false; }, [] { throw dopt::TimeoutError("test", "gave up"); }),
                    dopt::TimeoutError);
    // Nobody drives now: the I/O thread takes over (after its linger).
    const auto out = pattern(70000, 2);
    std::vector<unsigned char> in(out.size());
    Waiter w;
    ms[1]->recv(0, Tag{3, 3}, in.data(), in.size(), w.cb());
    ms[0]->send(1, Tag{3, 3}, out.data(), out.size(), w.cb());
    w.wait_ok();
    CHECK(in == out);
  }

  SECTION("close() while a thread drives: its operations fail, the drive ends, close returns") {
    char c = 0;
    Waiter w;
    ms[1]->recv(0, Tag{3, 4}, &c, 1, w.cb());
    std::atomic<bool> driving{false};
    std::thread t([&] {
      ms[1]->drive(
          [&] {
            driving = true;
            return false;
          },
          [] {});
    });
    while (!driving) std::this_thread::yield();
    ms[1]->close();
    t.join();
    const auto es = w.wait();
    REQUIRE(es[0]);
    CHECK(is<dopt::StateError>(es[0]));
  }
}

TEST_CASE("tcp mesh: connect timeout names the missing peer", "[tcp]") {
  std::string dead;
  {
    auto l = TcpMesh::listen("127.0.0.1");
    dead = "127.0.0.1:" + std::to_string(l.port());
  }  // closed: connecting there is refused
  SECTION("the connecting side") {
    auto l0 = TcpMesh::listen("127.0.0.1");
    try {
      TcpMesh m(0, 2, std::move(l0), {"unused", dead}, 300ms);
      FAIL("no error");
    } catch (const dopt::TimeoutError& e) {
      CHECK_THAT(e.what(), Catch::Contains("rank 1") && Catch::Contains(dead) &&
                               Catch::Contains("300 ms"));
    }
  }
  SECTION("the accepting side") {
    auto l1 = TcpMesh::listen("127.0.0.1");
    try {
      TcpMesh m(1, 2, std::move(l1), {dead, "unused"}, 200ms);
      FAIL("no error");
    } catch (const dopt::TimeoutError& e) {
      CHECK_THAT(e.what(), Catch::Contains("rank 0 did not connect"));
    }
  }
}

TEST_CASE("tcp mesh: setup errors", "[tcp]") {
  CHECK_THROWS_AS(TcpMesh(0, 2, TcpMesh::listen("127.0.0.1"), {"a:1"}, 100ms), dopt::ValueError);
  CHECK_THROWS_AS(TcpMesh(2, 2, TcpMesh::listen("127.0.0.1"), {"a:1", "b:2"}, 100ms), dopt::ValueError);
  CHECK_THROWS_AS(TcpMesh(0, 2, TcpListener{}, {"a:1", "b:2"}, 100ms), dopt::ValueError);
  try {
    TcpMesh(0, 2, TcpMesh::listen("127.0.0.1"), {"x", "nohostport"}, 100ms);
    FAIL("no error");
  } catch (const dopt::IOError& e) {
    CHECK_THAT(e.what(), Catch::Contains("nohostport") && Catch::Contains("rank 1"));
  }
  // A peer that believes in another world size.
  auto l0 = TcpMesh::listen("127.0.0.1");
  auto l1 = TcpMesh::listen("127.0.0.1");
  const std::string e0 = "127.0.0.1:" + std::to_string(l0.port());
  const std::string e1 = "127.0.0.1:" + std::to_string(l1.port());
  auto f1 = std::async(std::launch::async, [&] {
    TcpMesh m(1, 3, std::move(l1), {e0, e1, "127.0.0.1:1"}, 2s);
  });
  auto f0 = std::async(std::launch::async, [&] { TcpMesh m(0, 2, std::move(l0), {e0, e1}, 500ms); });
  try {
    f1.get();
    FAIL("no error");
  } catch (const dopt::IOError& e) {
    CHECK_THAT(e.what(), Catch::Contains("world of 2"));
  }
  CHECK_THROWS_AS(f0.get(), dopt::Error);
}

TEST_CASE("tcp mesh: vacant slots (absent) are lost from the start, and a newcomer in one connects later", "[tcp]") {
  for (const auto& [n, absent] : std::vector<std::pair<int, std::vector<int>>>{{3, {2}}, {5, {1, 4}}}) {
    INFO("world " << n);
    std::vector<int> present;
    for (int r = 0; r < n; ++r)
      if (std::find(absent.begin(), absent.end(), r) == absent.end()) present.push_back(r);
    std::vector<TcpListener> ls(static_cast<std::size_t>(n));
    std::vector<std::string> eps(static_cast<std::size_t>(n));
    for (int r : present) {
      ls[std::size_t(r)] = TcpMesh::listen("127.0.0.1");
      eps[std::size_t(r)] = "127.0.0.1:" + std::to_string(ls[std::size_t(r)].port());
    }
    TcpMeshOptions o;
    o.absent = absent;
    std::vector<std::future<std::unique_ptr<TcpMesh>>> fs;
    for (int r : present)
      fs.push_back(std::async(std::launch::async, [&, r] {
        return std::make_unique<TcpMesh>(r, n, std::move(ls[std::size_t(r)]), eps, 20s, o);
      }));
    std::vector<std::unique_ptr<TcpMesh>> ms(static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < present.size(); ++i) ms[std::size_t(present[i])] = fs[i].get();
    // Every pair of present ranks talks; a vacant slot fails at once, named.
    auto exchange = [&](int a, int b) {
      int v = a * 10 + b, got = -1;
      Waiter w;
      ms[std::size_t(b)]->recv(a, &got, sizeof got, w.cb());
      ms[std::size_t(a)]->send(b, &v, sizeof v, w.cb());
      w.wait_ok();
      CHECK(got == v);
    };
    for (int a : present)
      for (int b : present)
        if (a != b) exchange(a, b);
    for (int a : present)
      for (int v : absent) {
        CHECK(ms[std::size_t(a)]->peer_lost(v));
        int x = 1;
        Waiter w;
        ms[std::size_t(a)]->send(v, &x, sizeof x, w.cb());
        auto e = w.wait();
        REQUIRE(e[0]);
        CHECK(is<dopt::PeerLostError>(e[0]));
        CHECK_THAT(message_of(e[0]), Catch::Contains("rank " + std::to_string(v) + "'s slot is vacant"));
      }
    // A newcomer takes the first vacant slot: its mesh accepts the present
    // ranks, each of which connects to it (reconnect_peer).
    const int v = absent.front();
    TcpListener nl = TcpMesh::listen("127.0.0.1");
    const std::string nep = "127.0.0.1:" + std::to_string(nl.port());
    TcpMeshOptions no;
    no.accept_from = present;
    auto nf = std::async(std::launch::async, [&] {
      return std::make_unique<TcpMesh>(v, n, std::move(nl), std::vector<std::string>(std::size_t(n)), 20s, no);
    });
    for (int a : present) ms[std::size_t(a)]->reconnect_peer(v, nep, 20s);
    ms[std::size_t(v)] = nf.get();
    for (int a : present) {
      exchange(a, v);
      exchange(v, a);
    }
  }
}
