// The handshake between ranks (handshake.hpp): the protocol, a blocking
// client and the choice of the bind address (the listening server is in
// auth_listener.cpp).
#include "dopt/runtime/internal/handshake.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "dopt/runtime/error.hpp"
#include "dopt/runtime/notice.hpp"

namespace dopt::net {

namespace {

constexpr char kMagic[kMagicSize + 1] = "dopt-hs1";
constexpr std::size_t kNonce = 32;
constexpr std::size_t kMac = 32;
constexpr std::size_t kJobMax = 255;
constexpr std::size_t kMsgMax = 296;
// hello
constexpr std::size_t kHPurpose = 8, kHFlags = 9, kHRank = 12, kHWorld = 16, kHJobLen = 20, kHJob = 21,
                      kHNonce = 276;
// reply
constexpr std::size_t kRStatus = 8, kRFlags = 9, kRRank = 12, kRWorld = 16, kRJobLen = 20, kRJob = 21,
                      kRNonce = 276, kRMac = 308, kRMsgLen = 340, kRMsg = 342;
// verdict
constexpr std::size_t kVStatus = 0, kVMsgLen = 2, kVMsg = 4;
static_assert(kRMsg + kMsgMax <= kReplySize && kVMsg + kMsgMax <= kVerdictSize && kHNonce + kNonce <= kHelloSize);

enum Status : unsigned char { k_go = 0, k_refused = 1, k_auth_refused = 2, k_other_job = 3 };

void put_i32(std::string& b, std::size_t at, std::int32_t v) {
  const auto u = static_cast<std::uint32_t>(v);
  for (int k = 0; k < 4; ++k) b[at + static_cast<std::size_t>(k)] = static_cast<char>((u >> (8 * k)) & 0xff);
}
std::int32_t get_i32(const std::string& b, std::size_t at) {
  std::uint32_t u = 0;
  for (int k = 3; k >= 0; --k) u = (u << 8) | static_cast<unsigned char>(b[at + static_cast<std::size_t>(k)]);
  return static_cast<std::int32_t>(u);
}
void put_text(std::string& b, std::size_t len_at, std::size_t at, const std::string& text, std::size_t max,
              bool two_byte_len) {
  const std::string t = text.substr(0, max);
  if (two_byte_len) {
    b[len_at] = static_cast<char>(t.size() & 0xff);
    b[len_at + 1] = static_cast<char>(t.size() >> 8);
  } else {
    b[len_at] = static_cast<char>(t.size());
  }
  std::memcpy(b.data() + at, t.data(), t.size());
}
std::string get_text(const std::string& b, std::size_t len_at, std::size_t at, std::size_t max, bool two_byte_len) {
  std::size_t n = static_cast<unsigned char>(b[len_at]);
  if (two_byte_len) n |= static_cast<std::size_t>(static_cast<unsigned char>(b[len_at + 1])) << 8;
  n = std::min(n, max);
  std::string t = b.substr(at, n);
  for (char& c : t)
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7e) c = '?';
  return t;
}

std::string random_bytes(std::size_t n) {
  std::string out(n, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(n)) != 1)
    throw IOError("handshake", "cannot draw random bytes (OpenSSL RAND_bytes failed)");
  return out;
}

std::string hmac(const std::string& key, const std::string& data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(data.data()),
            data.size(), out, &len) ||
      len != kMac)
    throw IOError("handshake", "HMAC-SHA256 failed (OpenSSL)");
  return std::string(reinterpret_cast<const char*>(out), len);
}

bool same(const std::string& a, const std::string& b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string job_text(const std::string& job) { return job.empty() ? "no job id" : "job '" + job + "'"; }

// What the server's status in its reply or verdict (msg: the status byte at
// status_at, its text's length at len_at and the text at text_at) means to
// the client: nothing for k_go, else the error it throws (naming op, the
// peer and rank me). other_job ends the message of k_other_job, after the
// client's job.
void check_status(const std::string& msg, std::size_t status_at, std::size_t len_at, std::size_t text_at,
                  const std::string& op, const std::string& peer, const std::string& my_job, const char* other_job,
                  int me) {
  const auto status = static_cast<unsigned char>(msg[status_at]);
  const std::string why = get_text(msg, len_at, text_at, kMsgMax, true);
  if (status == k_other_job)
    throw ValueError(op, peer + " belongs to another job than this process (" + job_text(my_job) + other_job, me);
  if (status == k_auth_refused) throw AuthenticationError(op, peer + " refused this process: " + why, me);
  if (status != k_go) throw ValueError(op, peer + " refused this process: " + why, me);
}

}  // namespace

const char* purpose_name(Purpose p) noexcept {
  switch (p) {
    case Purpose::rendezvous: return "the rendezvous";
    case Purpose::control: return "a control port";
    case Purpose::data: return "a data port";
    case Purpose::rejoin: return "the rendezvous (rejoining)";
  }
  return "an unknown port";
}

Credentials Credentials::from(const LaunchEnv& env) {
  Credentials c;
  c.job_id = env.job_id;
  c.secret = env.secret;
  c.rank = env.rank;
  c.world_size = env.world_size;
  return c;
}

// --- client ---------------------------------------------------------------------------

ClientHandshake::ClientHandshake(Purpose purpose, Credentials mine, std::string peer, std::string op)
    : purpose_(purpose), mine_(std::move(mine)), peer_(std::move(peer)), op_(std::move(op)) {
  hello_.assign(kHelloSize, '\0');
  std::memcpy(hello_.data(), kMagic, kMagicSize);
  hello_[kHPurpose] = static_cast<char>(purpose_);
  hello_[kHFlags] = static_cast<char>(mine_.secret.empty() ? 0 : 1);
  put_i32(hello_, kHRank, mine_.rank);
  put_i32(hello_, kHWorld, mine_.world_size);
  put_text(hello_, kHJobLen, kHJob, mine_.job_id, kJobMax, false);
  const std::string nonce = random_bytes(kNonce);
  std::memcpy(hello_.data() + kHNonce, nonce.data(), kNonce);
}

std::string ClientHandshake::on_reply(const std::string& reply) {
  const int me = mine_.rank;
  if (reply.size() != kReplySize || std::memcmp(reply.data(), kMagic, kMagicSize) != 0)
    throw IOError(op_, peer_ + " answered with something that is not dopt's handshake: is another program (not a "
                               "dopt rank) listening on that port?", me);
  reply_ = reply;
  server_rank_ = get_i32(reply, kRRank);
  // The server never names its job to a process that is not of it: a
  // stranger must not learn the id it would need to pass this check.
  check_status(reply, kRStatus, kRMsgLen, kRMsg, op_, peer_, mine_.job_id,
               "): two jobs use the same address and port (give each job its own MASTER_PORT, or the same "
               "DOPT_JOB_ID if they are one job)",
               me);
  const bool has_secret = (static_cast<unsigned char>(reply[kRFlags]) & 1) != 0;
  if (!mine_.secret.empty()) {
    if (!has_secret)
      throw AuthenticationError(op_, peer_ + " has no secret but this process has one: every rank needs the same "
                                             "DOPT_SECRET_FILE (or DOPT_SECRET)", me);
    const std::string expect = hmac(mine_.secret, "dopt-hs1 server" + hello_ + reply.substr(0, kRMac));
    if (!same(expect, reply.substr(kRMac, kMac)))
      throw AuthenticationError(op_, peer_ + " could not prove that it knows this job's secret: refusing it (a "
                                             "process of another job, or a different DOPT_SECRET_FILE?)", me);
    return hmac(mine_.secret, "dopt-hs1 client" + hello_ + reply);
  }
  if (has_secret)
    throw AuthenticationError(op_, peer_ + " requires a secret but this process has none: set DOPT_SECRET_FILE "
                                           "(or DOPT_SECRET) as for the other ranks", me);
  return std::string(kProofSize, '\0');
}

void ClientHandshake::on_verdict(const std::string& verdict) {
  const int me = mine_.rank;
  if (verdict.size() != kVerdictSize) throw IOError(op_, peer_ + " sent a truncated handshake verdict", me);
  check_status(verdict, kVStatus, kVMsgLen, kVMsg, op_, peer_, mine_.job_id,
               ") that has the same secret: give each job its own MASTER_PORT, or the same DOPT_JOB_ID if they are "
               "one job",
               me);
}

// --- server ---------------------------------------------------------------------------

ServerHandshake::ServerHandshake(Purpose purpose, Credentials mine, Admit admit)
    : purpose_(purpose), mine_(std::move(mine)), admit_(std::move(admit)) {}

std::string ServerHandshake::refusal_reply(const std::string& why) {
  std::string reply(kReplySize, '\0');
  std::memcpy(reply.data(), kMagic, kMagicSize);
  reply[kRStatus] = static_cast<char>(k_refused);
  put_i32(reply, kRRank, -1);
  put_text(reply, kRMsgLen, kRMsg, why, kMsgMax, true);
  return reply;
}

bool ServerHandshake::magic_ok(const std::string& first_bytes) {
  return first_bytes.size() >= kMagicSize && std::memcmp(first_bytes.data(), kMagic, kMagicSize) == 0;
}

std::string ServerHandshake::on_hello(const std::string& hello) {
  hello_ = hello;
  reply_.assign(kReplySize, '\0');
  std::memcpy(reply_.data(), kMagic, kMagicSize);
  const bool secret = !mine_.secret.empty();
  reply_[kRFlags] = static_cast<char>(secret ? 1 : 0);
  // With a secret, the server's rank and world size are for a process that
  // proved it (they are not in the reply, which goes out before the proof).
  put_i32(reply_, kRRank, secret ? -1 : mine_.rank);
  put_i32(reply_, kRWorld, secret ? 0 : mine_.world_size);
  // kRJob stays empty: the reply goes to a process not yet known to be of
  // this job.
  // why: told to the client; note (when given): this side's notice, which
  // may name this job.
  auto refuse = [&](Status st, const std::string& why, const std::string& note = {}) {
    refused_ = true;
    refusal_ = note.empty() ? why : note;
    put_i32(reply_, kRRank, -1);  // a refused process learns nothing but the reason
    put_i32(reply_, kRWorld, 0);
    reply_[kRStatus] = static_cast<char>(st);
    put_text(reply_, kRMsgLen, kRMsg, why, kMsgMax, true);
    return reply_;
  };
  // The size first: the fields below are read at fixed offsets (a short
  // hello read past its end; found by fuzz/handshake.cpp).
  if (hello.size() != kHelloSize || !magic_ok(hello)) return refuse(k_refused, "not a dopt handshake");
  peer_.purpose = static_cast<Purpose>(static_cast<unsigned char>(hello[kHPurpose]));
  peer_.rank = get_i32(hello, kHRank);
  peer_.world_size = get_i32(hello, kHWorld);
  peer_.job_id = get_text(hello, kHJobLen, kHJob, kJobMax, false);
  const bool client_secret = (static_cast<unsigned char>(hello[kHFlags]) & 1) != 0;
  const std::string job_note =
      "this port belongs to " + job_text(mine_.job_id) + ", the connecting process to " + job_text(peer_.job_id);
  if (secret) {
    // A job with a secret says the same to every process that cannot prove
    // it, whatever job id it presents: whether a guessed id is right is not
    // told before the proof (the job id is checked with the proof).
    if (!client_secret)
      return refuse(k_auth_refused,
                    "this port requires its job's secret and the connecting process has none (set DOPT_SECRET_FILE "
                    "or DOPT_SECRET as for the other ranks)",
                    peer_.job_id == mine_.job_id ? std::string() : job_note + "; it has no secret either");
    job_differs_ = peer_.job_id != mine_.job_id;
  } else {
    if (peer_.job_id != mine_.job_id) return refuse(k_other_job, "this port belongs to another job", job_note);
    if (client_secret)
      return refuse(k_auth_refused, "the connecting process has a secret but this one has none: every rank needs "
                                    "the same DOPT_SECRET_FILE (or DOPT_SECRET)");
  }
  const std::string nonce = random_bytes(kNonce);
  std::memcpy(reply_.data() + kRNonce, nonce.data(), kNonce);
  if (secret) {
    const std::string mac = hmac(mine_.secret, "dopt-hs1 server" + hello_ + reply_.substr(0, kRMac));
    std::memcpy(reply_.data() + kRMac, mac.data(), kMac);
  }
  return reply_;
}

std::string ServerHandshake::on_proof(const std::string& proof) {
  std::string verdict(kVerdictSize, '\0');
  auto refuse = [&](Status st, const std::string& why) {
    refusal_ = why;
    verdict[kVStatus] = static_cast<char>(st);
    put_text(verdict, kVMsgLen, kVMsg, why, kMsgMax, true);
    return verdict;
  };
  if (refused_) return refuse(k_refused, refusal_);
  if (!mine_.secret.empty() && !same(proof, hmac(mine_.secret, "dopt-hs1 client" + hello_ + reply_))) {
    const std::string why = "authentication failed: the connecting process does not know this job's secret";
    refuse(k_auth_refused, why);
    if (job_differs_)  // this side's note says more than the client is told
      refusal_ = why + " (this port belongs to " + job_text(mine_.job_id) + ", the connecting process to " +
                 job_text(peer_.job_id) + ")";
    return verdict;
  }
  // Told only to a client that proved itself.
  if (job_differs_) {
    refuse(k_other_job, "this port belongs to another job (the same secret, another DOPT_JOB_ID)");
    refusal_ = "this port belongs to " + job_text(mine_.job_id) + ", the connecting process to " +
               job_text(peer_.job_id);  // this side's note
    return verdict;
  }
  if (peer_.purpose != purpose_ && !(purpose_ == Purpose::rendezvous && peer_.purpose == Purpose::rejoin))
    return refuse(k_refused, std::string("this is ") + purpose_name(purpose_) + " of rank " +
                                 std::to_string(mine_.rank) + ", not " + purpose_name(peer_.purpose));
  if (admit_) {
    const std::string why = admit_(peer_);
    if (!why.empty()) return refuse(k_refused, why);
  }
  admitted_ = true;
  return verdict;
}

// --- blocking client I/O --------------------------------------------------------------

namespace {

using Clock = std::chrono::steady_clock;

int ms_left(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<long long>(left, 1 << 30));
}

/// Waits for `events` on fd until deadline; false on timeout.
bool wait_fd(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, ms_left(deadline));
    if (n > 0) return true;
    if (n == 0) return false;
    if (errno != EINTR) return true;  // let the read/write report it
  }
}

enum class IoResult { ok, timeout, closed, error };

IoResult write_all(int fd, const std::string& data, Clock::time_point deadline, std::string* why) {
  std::size_t off = 0;
  while (off < data.size()) {
    const ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n > 0) {
      off += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!wait_fd(fd, POLLOUT, deadline)) return IoResult::timeout;
      continue;
    }
    *why = std::strerror(errno);
    return IoResult::error;
  }
  return IoResult::ok;
}

IoResult read_exactly(int fd, std::size_t n, std::string* out, Clock::time_point deadline, std::string* why) {
  out->assign(n, '\0');
  std::size_t off = 0;
  while (off < n) {
    const ssize_t r = ::recv(fd, out->data() + off, n - off, 0);
    if (r > 0) {
      off += static_cast<std::size_t>(r);
      continue;
    }
    if (r == 0) return off == 0 ? IoResult::closed : IoResult::error;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!wait_fd(fd, POLLIN, deadline)) return IoResult::timeout;
      continue;
    }
    *why = std::strerror(errno);
    return IoResult::error;
  }
  return IoResult::ok;
}

struct FdGuard {
  int fd = -1;
  ~FdGuard() {
    if (fd >= 0) ::close(fd);
  }
  int release() {
    const int f = fd;
    fd = -1;
    return f;
  }
};

}  // namespace

std::optional<int> connect_authenticated(const std::string& host, int port, Purpose purpose,
                                         const Credentials& mine, std::chrono::milliseconds handshake_timeout,
                                         std::chrono::steady_clock::time_point deadline, const std::string& peer,
                                         const std::string& op, RetryLater* retry) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string port_text = std::to_string(port);
  const int gai = ::getaddrinfo(host.c_str(), port_text.c_str(), &hints, &res);
  if (gai != 0) {
    retry->reason = "cannot resolve '" + host + "': " + ::gai_strerror(gai);
    return std::nullopt;
  }
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> list(res, ::freeaddrinfo);
  FdGuard sock;
  std::string last = "no address";
  for (addrinfo* a = res; a; a = a->ai_next) {
    FdGuard s;
    s.fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (s.fd < 0) {
      const int e = errno;
      if (e == EMFILE || e == ENFILE || e == ENOMEM || e == ENOBUFS)  // no retry cures these: named here
        throw IOError(op, "cannot open a socket to reach " + peer + ": " + errno_text(e), mine.rank);
      last = std::strerror(e);
      continue;
    }
    if (::connect(s.fd, a->ai_addr, a->ai_addrlen) != 0) {
      if (errno != EINPROGRESS) {
        last = std::strerror(errno);
        continue;
      }
      if (!wait_fd(s.fd, POLLOUT, deadline)) {
        last = "no answer to the connection request";
        continue;
      }
      int err = 0;
      socklen_t len = sizeof err;
      ::getsockopt(s.fd, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) {
        last = std::strerror(err);
        continue;
      }
    }
    sock.fd = s.release();
    break;
  }
  if (sock.fd < 0) {
    retry->reason = last;
    return std::nullopt;
  }
  const int one = 1;
  ::setsockopt(sock.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  const auto hs_deadline = Clock::now() + handshake_timeout;
  const std::string no_answer = peer + " accepted the connection but did not answer dopt's handshake within " +
                                std::to_string(handshake_timeout.count()) +
                                " ms (DOPT_HANDSHAKE_TIMEOUT_MS): is another program (not a dopt rank) listening "
                                "on that port, or is that process stuck?";
  ClientHandshake hs(purpose, mine, peer, op);
  std::string why, reply, verdict;
  switch (write_all(sock.fd, hs.hello(), hs_deadline, &why)) {
    case IoResult::ok: break;
    case IoResult::timeout: throw TimeoutError(op, no_answer, mine.rank);
    default: retry->reason = "the connection failed: " + why; return std::nullopt;
  }
  switch (read_exactly(sock.fd, kReplySize, &reply, hs_deadline, &why)) {
    case IoResult::ok: break;
    case IoResult::timeout: throw TimeoutError(op, no_answer, mine.rank);
    case IoResult::closed: retry->reason = "the connection was closed before an answer"; return std::nullopt;
    default:
      if (reply.compare(0, kMagicSize, kMagic) != 0 && reply.find_first_not_of('\0') != std::string::npos)
        throw IOError(op, peer + " answered with something that is not dopt's handshake: is another program (not a "
                                 "dopt rank) listening on that port?", mine.rank);
      retry->reason = "the connection failed during the handshake" + (why.empty() ? "" : ": " + why);
      return std::nullopt;
  }
  const std::string proof = hs.on_reply(reply);  // throws refusals
  if (write_all(sock.fd, proof, hs_deadline, &why) != IoResult::ok ||
      read_exactly(sock.fd, kVerdictSize, &verdict, hs_deadline, &why) != IoResult::ok) {
    if (Clock::now() >= hs_deadline) throw TimeoutError(op, no_answer, mine.rank);
    throw IOError(op, peer + " closed the connection during the handshake" + (why.empty() ? "" : ": " + why),
                  mine.rank);
  }
  hs.on_verdict(verdict);
  return sock.release();
}

// --- where to listen ------------------------------------------------------------------

std::vector<int> listen_ports(int port, int lo, int hi) {
  if (port != 0 || lo <= 0 || hi < lo) return {port};
  std::vector<int> out;
  const int n = hi - lo + 1;
  std::random_device rd;
  const int start = static_cast<int>(rd() % static_cast<unsigned>(n));
  for (int i = 0; i < n; ++i) out.push_back(lo + (start + i) % n);
  return out;
}

std::string port_range_text(int lo, int hi) {
  if (lo <= 0) return {};
  return "no free port in DOPT_PORT_RANGE=" + std::to_string(lo) + "-" + std::to_string(hi);
}

namespace {

bool is_loopback(const sockaddr* sa) {
  if (sa->sa_family == AF_INET)
    return (ntohl(reinterpret_cast<const sockaddr_in*>(sa)->sin_addr.s_addr) >> 24) == 127;
  if (sa->sa_family == AF_INET6) return IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr);
  return false;
}

std::string numeric(const sockaddr* sa, socklen_t len) {
  char host[NI_MAXHOST] = {};
  if (::getnameinfo(sa, len, host, sizeof host, nullptr, 0, NI_NUMERICHOST) != 0) return {};
  return host;
}

/// MASTER_ADDR is a host name (not an address, not "localhost").
bool is_host_name(std::string host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  in6_addr a6{};
  in_addr a4{};
  std::string lower = host;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const bool address = ::inet_pton(AF_INET, host.c_str(), &a4) == 1 || ::inet_pton(AF_INET6, host.c_str(), &a6) == 1;
  return !host.empty() && !address && lower != "localhost" && lower.find('%') == std::string::npos;
}

std::string hostname() {
  char h[256] = {};
  ::gethostname(h, sizeof h - 1);
  return h;
}

/// The local address the kernel sends from to reach host (a loopback
/// address of its family when host is loopback, and then *loopback = true,
/// or "" for it when loopback is null); "" when host does not resolve.
std::string route_source(std::string host, int port, bool* loopback) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || !res) return {};
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> list(res, ::freeaddrinfo);
  if (is_loopback(res->ai_addr)) {
    if (!loopback) return {};
    *loopback = true;
    // The address itself: a host's own name is 127.0.1.1 on Debian, where
    // a listener on 127.0.0.1 is not reached.
    const std::string self = numeric(res->ai_addr, res->ai_addrlen);
    return !self.empty() ? self : res->ai_family == AF_INET6 ? "::1" : "127.0.0.1";
  }
  std::string out;
  const int s = ::socket(res->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_storage local{};
  socklen_t len = sizeof local;
  if (s >= 0 && ::connect(s, res->ai_addr, res->ai_addrlen) == 0 &&
      ::getsockname(s, reinterpret_cast<sockaddr*>(&local), &len) == 0)
    out = numeric(reinterpret_cast<sockaddr*>(&local), len);
  if (s >= 0) ::close(s);
  return out;
}

}  // namespace

BindPlan choose_bind_address(const LaunchEnv& env) {
  BindPlan plan;
  if (!env.bind_addr.empty()) {
    plan.bind = env.bind_addr;
  } else if (!env.socket_ifname.empty()) {
    ifaddrs* ifs = nullptr;
    if (::getifaddrs(&ifs) != 0)
      throw ValueError("launch_env", std::string("cannot list the network interfaces: ") + std::strerror(errno),
                       env.rank);
    bool exists = false;
    std::string v6_global, v6_link;
    for (ifaddrs* i = ifs; i; i = i->ifa_next) {
      if (!i->ifa_name || env.socket_ifname != i->ifa_name) continue;
      exists = true;
      if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET) {
        plan.bind = numeric(i->ifa_addr, sizeof(sockaddr_in));
        break;
      }
      if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET6) {
        const auto* a6 = reinterpret_cast<const sockaddr_in6*>(i->ifa_addr);
        std::string text = numeric(i->ifa_addr, sizeof(sockaddr_in6));  // link-local: "fe80::1%eth0"
        if (IN6_IS_ADDR_LINKLOCAL(&a6->sin6_addr)) {
          if (v6_link.empty()) v6_link = text;
        } else if (v6_global.empty()) {
          v6_global = text;
        }
      }
    }
    if (plan.bind.empty()) plan.bind = !v6_global.empty() ? v6_global : v6_link;
    ::freeifaddrs(ifs);
    if (plan.bind.empty())
      throw ValueError("launch_env", "DOPT_SOCKET_IFNAME=" + env.socket_ifname +
                                         (exists ? " has no IPv4 or IPv6 address" : " is not a network interface of this host"),
                       env.rank);
  } else {
    // From MASTER_ADDR: loopback stays on loopback; otherwise the address the
    // kernel would send from to reach MASTER_ADDR (rank 0: MASTER_ADDR itself).
    bool loopback = false;
    plan.bind = route_source(env.master_addr, env.master_port, &loopback);
    // A host name that is loopback here while the job spans hosts: rank 0's
    // host by its own name (torchrun's c10d rendezvous sets MASTER_ADDR so),
    // which /etc/hosts maps to 127.0.1.1 here and the other hosts to its
    // address: every interface, as torch's store listens.
    if (loopback && env.world_size > env.local_world_size && is_host_name(env.master_addr))
      plan.bind = plan.bind.find(':') != std::string::npos ? "::" : "0.0.0.0";
    if (plan.bind.empty()) plan.bind = "0.0.0.0";  // MASTER_ADDR does not resolve here (yet)
  }
  plan.wildcard = plan.bind == "0.0.0.0" || plan.bind == "::" || plan.bind == "*";
  if (plan.bind == "*") plan.bind = "0.0.0.0";
  if (!env.advertise_addr.empty()) plan.advertise = env.advertise_addr;
  else if (!plan.wildcard) plan.advertise = plan.bind;
  else {
    // Every interface: advertise the one that reaches MASTER_ADDR (peers on
    // other hosts route back the same way); a host name only when MASTER_ADDR
    // does not resolve or is loopback (every rank is then on this host).
    plan.advertise = route_source(env.master_addr, env.master_port, nullptr);
    if (plan.advertise.empty()) plan.advertise = hostname();
  }
  return plan;
}

}  // namespace dopt::net
