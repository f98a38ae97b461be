// A client of torch's TCPStore (torch_store.hpp). Wire format of torch 1.13
// (torch/csrc/distributed/c10d/TCPStore.cpp), host byte order:
//   query:  u8 type (SET 0, GET 2, WAIT 5), then per type
//   SET:    u64 key length, key, u64 value length, value    (no answer)
//   WAIT:   u64 number of keys (1), u64 key length, key     -> u8 0 (stop waiting)
//   GET:    u64 key length, key                             -> u64 length, value
// The client prefixes every key with "/" as torch's own client does.
#include "dopt/runtime/internal/torch_store.hpp"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <thread>

#include "dopt/runtime/error.hpp"

namespace dopt::net {

namespace {

constexpr const char* kOp = "torch store";
using Clock = std::chrono::steady_clock;

enum : std::uint8_t { kSet = 0, kGet = 2, kWait = 5 };

std::string strip_brackets(std::string h) {
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') return h.substr(1, h.size() - 2);
  return h;
}

}  // namespace

TorchStoreClient::TorchStoreClient(const std::string& host, int port, std::chrono::milliseconds timeout)
    : where_(host + ":" + std::to_string(port)), timeout_(timeout) {
  const auto deadline = Clock::now() + timeout;
  std::string last;
  while (fd_ < 0) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    const int gai = ::getaddrinfo(strip_brackets(host).c_str(), std::to_string(port).c_str(), &hints, &res);
    if (gai != 0) {
      last = std::string("cannot resolve '") + host + "': " + ::gai_strerror(gai);
    } else {
      for (addrinfo* a = res; a && fd_ < 0; a = a->ai_next) {
        const int s = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (s < 0) continue;
        if (::connect(s, a->ai_addr, a->ai_addrlen) == 0) fd_ = s;
        else {
          last = std::strerror(errno);
          ::close(s);
        }
      }
      ::freeaddrinfo(res);
    }
    if (fd_ >= 0) break;
    if (Clock::now() >= deadline)
      throw TimeoutError(kOp, "could not reach torch's store at " + where_ + " within " +
                                  std::to_string(timeout.count()) + " ms (last error: " + last + ")");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

TorchStoreClient::~TorchStoreClient() {
  if (fd_ >= 0) ::close(fd_);
}

namespace {

void write_all(int fd, const std::string& bytes, const std::string& where) {
  std::size_t off = 0;
  while (off < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw IOError(kOp, "torch's store at " + where + " closed the connection: " + std::strerror(errno));
    off += static_cast<std::size_t>(n);
  }
}

std::string read_exactly(int fd, std::size_t len, Clock::time_point deadline, const std::string& where,
                         const std::string& waiting_for) {
  std::string out(len, '\0');
  std::size_t off = 0;
  while (off < len) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) throw TimeoutError(kOp, waiting_for + " at torch's store " + where + ": no answer in time");
    pollfd p{fd, POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::min<long long>(left, 1000)));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;
    const ssize_t n = ::recv(fd, out.data() + off, len - off, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw IOError(kOp, "torch's store at " + where + " closed the connection while " + waiting_for);
    off += static_cast<std::size_t>(n);
  }
  return out;
}

std::string u64(std::uint64_t v) { return std::string(reinterpret_cast<const char*>(&v), sizeof v); }
std::string str(const std::string& s) { return u64(s.size()) + s; }

}  // namespace

void TorchStoreClient::set(const std::string& key, const std::string& value) {
  write_all(fd_, std::string(1, static_cast<char>(kSet)) + str("/" + key) + str(value), where_);
}

std::string TorchStoreClient::get(const std::string& key) {
  const auto deadline = Clock::now() + timeout_;
  const std::string what = "waiting for the key '" + key + "'";
  write_all(fd_, std::string(1, static_cast<char>(kWait)) + u64(1) + str("/" + key), where_);
  read_exactly(fd_, 1, deadline, where_, what);
  write_all(fd_, std::string(1, static_cast<char>(kGet)) + str("/" + key), where_);
  std::uint64_t len = 0;
  const std::string l = read_exactly(fd_, sizeof len, deadline + std::chrono::seconds(5), where_, what);
  std::memcpy(&len, l.data(), sizeof len);
  if (len > (1u << 20)) throw IOError(kOp, "torch's store at " + where_ + " answered with a value of " +
                                               std::to_string(len) + " bytes for '" + key + "'");
  return read_exactly(fd_, static_cast<std::size_t>(len), deadline + std::chrono::seconds(5), where_, what);
}

}  // namespace dopt::net
