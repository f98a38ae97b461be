#pragma once
// Internal to dopt_actors (includes CAF): CAF's middleman behind dopt's
// handshake. CAF 0.17's BASP has no authentication hook, so no CAF doorman
// listens anywhere: dopt's AuthListener (runtime/handshake.hpp) owns every
// listening socket, runs the handshake, and only a connection that passed it
// is handed to CAF's BASP broker (as a scribe for the published actor). The
// connecting side runs the handshake on its own socket first and hands that
// to BASP the same way. An unauthenticated process therefore never exchanges
// one byte with CAF, and reaches no actor (rendezvous, rank actors, RPC).
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "caf/actor.hpp"
#include "caf/actor_system.hpp"
#include "dopt/runtime/internal/handshake.hpp"
#include "dopt/runtime/launch_env.hpp"

namespace dopt::detail {

/// `whom` published on an authenticated listener. close() (also the
/// destructor) stops listening; established connections stay.
class SecurePublication {
 public:
  /// base: the listener's options (bind address, port, purpose, credentials,
  /// handshake timeout, admit, what); on_ready is set here. Throws IOError
  /// when the port cannot be bound.
  SecurePublication(caf::actor_system& sys, caf::actor whom, net::AuthListener::Options base);
  ~SecurePublication();
  SecurePublication(const SecurePublication&) = delete;
  SecurePublication& operator=(const SecurePublication&) = delete;
  std::uint16_t port() const noexcept;
  void close();

 private:
  std::unique_ptr<net::AuthListener> listener_;
};

/// Connects to host:port with dopt's handshake, then lets BASP connect over
/// that socket; returns the actor published there. While the connection is
/// refused, the name does not resolve or the connection breaks before the
/// server answered, it retries every 50 ms until `deadline` when
/// `retry_until_deadline`, else throws PeerLostError at once. Throws as
/// net::connect_authenticated for the other failures, TimeoutError when
/// nothing was reached by `deadline` ("could not reach PEER within ..."),
/// and PeerLostError / TimeoutError (after the handshake timeout) when
/// CAF's own handshake fails on the authenticated socket. When
/// `refused_means` is not "", a refused connection is not retried: it
/// throws PeerLostError at once, saying what the refusal means (a replacement
/// dialling rank 0, which listened for the whole job: rank 0 is gone).
caf::actor secure_remote_actor(caf::actor_system& sys, const std::string& host, int port, net::Purpose purpose,
                               const net::Credentials& creds, std::chrono::milliseconds handshake_timeout,
                               std::chrono::steady_clock::time_point deadline, bool retry_until_deadline,
                               const std::string& peer, const std::string& op, const std::string& refused_means = {});

/// The address to connect to for a peer that advertised `advertised` (and
/// bound `bind`, possibly every interface): ranks on the same host whose
/// peer listens on every interface or on loopback use 127.0.0.1.
std::string peer_connect_address(bool same_host, const std::string& advertised, const std::string& bind);

}  // namespace dopt::detail
