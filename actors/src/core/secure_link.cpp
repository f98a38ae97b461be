// CAF's middleman behind dopt's handshake (secure_link.hpp).
#include "core/secure_link.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>
#include <thread>

#include "caf/all.hpp"
#include "caf/io/all.hpp"
#include "caf/io/basp_broker.hpp"
#include "core/basp_guard.hpp"
#include "core/caf_thread.hpp"
#include "dopt/runtime/error.hpp"
#include "dopt/runtime/notice.hpp"

namespace dopt::detail {

namespace {

caf::actor basp_broker(caf::actor_system& sys) {
  return sys.middleman().named_broker<caf::io::basp_broker>(caf::atom("BASP"));
}

/// The largest CAF payload a connection accepts: any (BASP's own u32
/// bound) from a peer that proved the secret; from one admitted by job id
/// alone (the rendezvous of a job without a secret), what the rendezvous
/// really sends: a rank's registration to rank 0, rank 0's table of every
/// rank to the others.
std::uint32_t max_payload(const net::Credentials& creds, BaspFrameCheck::Side side) {
  if (!creds.secret.empty()) return 0xffffffffu;
  return side == BaspFrameCheck::Side::server ? kUnauthenticatedToServer : kUnauthenticatedToClient;
}

}  // namespace

SecurePublication::SecurePublication(caf::actor_system& sys, caf::actor whom, net::AuthListener::Options base) {
  caf::actor basp = basp_broker(sys);
  auto strong = caf::actor_cast<caf::strong_actor_ptr>(whom);
  auto port = std::make_shared<std::uint16_t>(0);
  caf::actor_system* s = &sys;
  const std::uint32_t max = max_payload(base.credentials, BaspFrameCheck::Side::server);
  base.on_ready = [s, basp, strong, port, max, what = base.what](int fd, const net::PeerHello&) {
    // Runs on the listener's thread: the scribe is made here and adopted by
    // the BASP broker, which writes its server handshake for `strong`.
    UserThreadCafScope caf_scope;
    caf::io::scribe_ptr scribe = guarded_scribe(*s, fd, BaspFrameCheck::Side::server, max, what);
    caf::anon_send(basp, caf::publish_atom_v, std::move(scribe), *port, strong, std::set<std::string>{});
  };
  listener_ = std::make_unique<net::AuthListener>(std::move(base));
  *port = listener_->port();
}

SecurePublication::~SecurePublication() { close(); }

std::uint16_t SecurePublication::port() const noexcept { return listener_ ? listener_->port() : 0; }

void SecurePublication::close() {
  if (listener_) listener_->close();
}

caf::actor secure_remote_actor(caf::actor_system& sys, const std::string& host, int port, net::Purpose purpose,
                               const net::Credentials& creds, std::chrono::milliseconds handshake_timeout,
                               std::chrono::steady_clock::time_point deadline, bool retry_until_deadline,
                               const std::string& peer, const std::string& op, const std::string& refused_means) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto next_note = std::chrono::seconds(10);
  int fd = -1;
  for (;;) {
    net::RetryLater retry;
    auto got = net::connect_authenticated(host, port, purpose, creds, handshake_timeout, deadline, peer, op, &retry);
    if (got) {
      fd = *got;
      break;
    }
    if (!retry_until_deadline)
      throw PeerLostError(op, "cannot connect to " + peer + ": " + retry.reason, creds.rank);
    if (!refused_means.empty() && retry.reason == std::strerror(ECONNREFUSED))
      throw PeerLostError(op, peer + " refused the connection (" + retry.reason + "): " + refused_means, creds.rank);
    if (Clock::now() >= deadline)
      throw TimeoutError(op, "could not reach " + peer + " within " +
                                 std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - start)
                                                    .count()) +
                                 " ms (last error: " + retry.reason + ")",
                         creds.rank);
    // Retrying for long says so: after 10 s, then every 30 s.
    const auto waited = std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - start);
    if (waited >= next_note) {
      notice(op + " [rank " + std::to_string(creds.rank) + "]: cannot reach " + peer + " yet after " +
             std::to_string(waited.count()) + " s (" + retry.reason + "); still trying for up to " +
             std::to_string((std::chrono::duration_cast<std::chrono::milliseconds>(deadline - start).count() + 999) / 1000) +
             " s in all (has that rank started?)");
      next_note = waited + std::chrono::seconds(30);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  // A second descriptor of the socket, to cut the connection should CAF's
  // own handshake never complete (BASP waits for it without a deadline).
  const int spare = ::dup(fd);
  UserThreadCafScope caf_scope;
  caf::io::scribe_ptr scribe =
      guarded_scribe(sys, fd, BaspFrameCheck::Side::client, max_payload(creds, BaspFrameCheck::Side::client), peer);
  caf::actor result;
  std::string failure;
  bool timed_out = false;
  {
    caf::scoped_actor self{sys};
    self->request(basp_broker(sys), caf::duration(handshake_timeout), caf::connect_atom_v, std::move(scribe),
                  static_cast<std::uint16_t>(port))
        .receive(
            [&](caf::node_id&, caf::strong_actor_ptr& addr, std::set<std::string>&) {
              if (addr) result = caf::actor_cast<caf::actor>(addr);
              else failure = "no actor is published there";
            },
            [&](caf::error& e) {
              timed_out = e == caf::sec::request_timeout;
              failure = sys.render(e);
            });
  }
  if (!result && spare >= 0) ::shutdown(spare, SHUT_RDWR);
  if (spare >= 0) ::close(spare);
  if (result) return result;
  if (timed_out)
    throw TimeoutError(op, peer + " passed dopt's handshake but CAF's handshake did not complete within " +
                               std::to_string(handshake_timeout.count()) + " ms",
                       creds.rank);
  throw PeerLostError(op, "cannot connect to " + peer + ": " + failure, creds.rank);
}

std::string peer_connect_address(bool same_host, const std::string& advertised, const std::string& bind) {
  const bool wildcard = bind == "0.0.0.0" || bind == "::" || bind.empty();
  const bool loopback = bind.rfind("127.", 0) == 0 || bind == "::1";
  if (same_host && (wildcard || loopback)) return loopback ? bind : "127.0.0.1";
  return advertised;
}

}  // namespace dopt::detail
