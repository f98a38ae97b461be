// dopt_bench_raw_tcp: the TCP limit between two hosts, for the multi-host
// comparison (bench/compare_multihost.sh): both sides send BYTES to each other
// at once over STREAMS connections (what an all_reduce between two hosts does),
// ITERS times, in two ways: a sending and a receiving thread per connection
// ("threads"), and one thread driving every connection with poll() ("poll":
// fewer threads, which won on this 2-CPU machine, as OpenMPI's one progress
// loop does). The server prints one JSON line per size and way:
//   {"impl": "raw_tcp", "mode", "streams", "bytes", "us", "gbs_per_direction"}
// (the summary takes the faster way as the limit).
//
//   dopt_bench_raw_tcp server PORT STREAMS BYTES,...      (on host 0)
//   dopt_bench_raw_tcp client HOST PORT STREAMS BYTES,... (on host 1)
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

void die(const char* what) {
  std::perror(what);
  std::exit(1);
}

void xfer(int fd, char* buf, std::size_t n, bool send) {
  std::size_t off = 0;
  while (off < n) {
    const ssize_t k = send ? ::send(fd, buf + off, n - off, MSG_NOSIGNAL) : ::recv(fd, buf + off, n - off, 0);
    if (k <= 0) die(send ? "send" : "recv");
    off += static_cast<std::size_t>(k);
  }
}

/// Every stream sends its share of bytes and receives as much, both at once.
double exchange(const std::vector<int>& fds, std::vector<std::vector<char>>& out, std::vector<std::vector<char>>& in,
                std::size_t bytes) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> ts;
  const std::size_t share = bytes / fds.size();
  for (std::size_t i = 0; i < fds.size(); ++i) {
    ts.emplace_back([&, i] { xfer(fds[i], out[i].data(), share, true); });
    ts.emplace_back([&, i] { xfer(fds[i], in[i].data(), share, false); });
  }
  for (auto& t : ts) t.join();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// The same exchange from one thread: non-blocking sockets, poll() for
/// whichever direction of whichever connection can move.
double exchange_poll(const std::vector<int>& fds, std::vector<std::vector<char>>& out,
                     std::vector<std::vector<char>>& in, std::size_t bytes) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::size_t share = bytes / fds.size();
  std::vector<std::size_t> sent(fds.size(), 0), got(fds.size(), 0);
  std::vector<pollfd> p(fds.size());
  for (;;) {
    int live = 0;
    for (std::size_t i = 0; i < fds.size(); ++i) {
      p[i] = pollfd{fds[i], short((sent[i] < share ? POLLOUT : 0) | (got[i] < share ? POLLIN : 0)), 0};
      live += p[i].events != 0;
    }
    if (live == 0) break;
    if (::poll(p.data(), p.size(), -1) < 0) die("poll");
    for (std::size_t i = 0; i < fds.size(); ++i) {
      if ((p[i].revents & (POLLERR | POLLHUP)) && !(p[i].revents & POLLIN)) die("connection");
      if (p[i].revents & POLLOUT) {
        const ssize_t k = ::send(fds[i], out[i].data() + sent[i], share - sent[i], MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k < 0 && errno != EAGAIN) die("send");
        if (k > 0) sent[i] += std::size_t(k);
      }
      if (p[i].revents & POLLIN) {
        const ssize_t k = ::recv(fds[i], in[i].data() + got[i], share - got[i], MSG_DONTWAIT);
        if (k == 0 || (k < 0 && errno != EAGAIN)) die("recv");
        if (k > 0) got[i] += std::size_t(k);
      }
    }
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s server PORT STREAMS BYTES,... | client HOST PORT STREAMS BYTES,...\n", argv[0]);
    return 2;
  }
  const bool server = std::strcmp(argv[1], "server") == 0;
  const int streams = std::atoi(argv[server ? 3 : 4]);
  std::vector<std::size_t> sizes;
  std::stringstream ss(argv[server ? 4 : 5]);
  for (std::string s; std::getline(ss, s, ',');) sizes.push_back(std::stoull(s));
  std::vector<int> fds;
  if (server) {
    addrinfo hints{}, *res = nullptr;
    hints.ai_family = AF_INET6;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    if (::getaddrinfo(nullptr, argv[2], &hints, &res) != 0) die("getaddrinfo");
    const int l = ::socket(res->ai_family, SOCK_STREAM, 0);
    const int one = 1, zero = 0;
    ::setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    ::setsockopt(l, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    if (::bind(l, res->ai_addr, res->ai_addrlen) != 0 || ::listen(l, 64) != 0) die("listen");
    for (int i = 0; i < streams; ++i) fds.push_back(::accept(l, nullptr, nullptr));
    ::close(l);
  } else {
    addrinfo hints{}, *res = nullptr;
    hints.ai_socktype = SOCK_STREAM;
    if (::getaddrinfo(argv[2], argv[3], &hints, &res) != 0) die("getaddrinfo");
    for (int i = 0; i < streams; ++i) {
      int fd = -1;
      for (int tries = 0; tries < 200; ++tries) {
        fd = ::socket(res->ai_family, SOCK_STREAM, 0);
        if (::connect(fd, res->ai_addr, res->ai_addrlen) == 0) break;
        ::close(fd);
        fd = -1;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      if (fd < 0) die("connect");
      fds.push_back(fd);
    }
  }
  for (int fd : fds) {
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  for (std::size_t bytes : sizes) {
    const int iters = bytes <= (1u << 20) ? 40 : bytes <= (64u << 20) ? 8 : 3;
    std::vector<std::vector<char>> out(fds.size(), std::vector<char>(bytes / fds.size() + 1, 1)),
        in(fds.size(), std::vector<char>(bytes / fds.size() + 1));
    for (const bool poll_mode : {false, true}) {
      auto once = [&] { return poll_mode ? exchange_poll(fds, out, in, bytes) : exchange(fds, out, in, bytes); };
      once();  // warm-up
      double total = 0;
      for (int i = 0; i < iters; ++i) total += once();
      const double us = total / iters * 1e6;
      if (server)
        std::printf("{\"impl\": \"raw_tcp\", \"mode\": \"%s\", \"streams\": %d, \"bytes\": %zu, \"iters\": %d, "
                    "\"us\": %.2f, \"gbs_per_direction\": %.4f}\n",
                    poll_mode ? "poll" : "threads", streams, bytes, iters, us, static_cast<double>(bytes) / us / 1e3);
      std::fflush(stdout);
    }
  }
  for (int fd : fds) ::close(fd);
  return 0;
}
