#pragma once
// dopt::net: the handshake every connection between ranks passes before any
// other byte is accepted: the rendezvous (rank 0's MASTER_PORT), the ranks'
// control ports (CAF's middleman, RPC) and the TCP data plane.
//
// Protocol (fixed-size messages, integers little-endian; docs/launching.md,
// "Who may join"):
//   1. client -> server  hello:  "dopt-hs1", purpose, has-secret flag, the
//                        client's rank and world size, its job id (<= 255
//                        bytes) and a fresh 32-byte random nonce Nc.
//   2. server -> client  reply:  status, has-secret flag, the server's rank
//                        and world size (without a secret only), a fresh
//                        nonce Ns and, with a secret, HMAC-SHA256(secret,
//                        "dopt-hs1 server" | hello | reply up to Ns); or a
//                        refusal with its reason. The server never sends its
//                        job id. Without a secret it refuses another job id
//                        here; with one, it refuses a client without a
//                        secret here with the same words whatever job id it
//                        presents, and checks the job id with the proof, so
//                        a stranger cannot learn whether a guessed id is right.
//   3. client -> server  proof:  HMAC-SHA256(secret, "dopt-hs1 client" |
//                        hello | reply) (zeros without a secret).
//   4. server -> client  verdict: admitted, or refused with the reason (a
//                        wrong proof, the world already closed, ...).
// Both sides prove they hold the secret, over nonces the other chose, so a
// recorded exchange cannot be replayed and the secret never travels. Without
// a secret the handshake still compares job ids (so two jobs on one port are
// told apart) but proves nothing. Nothing after the handshake is encrypted
// or authenticated per message: an attacker who can inject into or take over
// an established TCP connection on the network path is not kept out.
//
// Errors seen by the connecting side (op and rank are the caller's):
//   ValueError           the server refused: another job, the world already
//                        closed, the wrong kind of port;
//   AuthenticationError  the secret is missing on one side, or differs;
//   IOError              the server answered with something that is not this
//                        handshake (another program holds the port);
//   TimeoutError         the server accepted the connection but did not
//                        answer within the handshake timeout.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dopt/runtime/launch_env.hpp"

namespace dopt::net {

/// Which kind of port a connection is for (a server refuses the others).
/// rejoin: a replacement of a lost rank at the rendezvous port (a server of
/// Purpose::rendezvous takes it too; its admit tells the two apart).
enum class Purpose : std::uint8_t { rendezvous = 1, control = 2, data = 3, rejoin = 4 };
/// "the rendezvous", "a control port", "a data port", "the rendezvous (rejoining)".
const char* purpose_name(Purpose p) noexcept;

/// What this process presents: from LaunchEnv (job_id, secret, rank,
/// world_size).
struct Credentials {
  std::string job_id;
  std::string secret;  // "" = no authentication
  int rank = -1;
  int world_size = 0;
  static Credentials from(const LaunchEnv& env);
};

/// What a server learns about a client that passed the handshake.
struct PeerHello {
  Purpose purpose = Purpose::control;
  int rank = -1;
  int world_size = 0;
  std::string job_id;
};

/// Called by a server once a client proved itself: "" admits it, anything
/// else refuses it with that text as the reason (sent to the client).
using Admit = std::function<std::string(const PeerHello&)>;

// --- the protocol without I/O (for drivers over any socket API) -----------------------

inline constexpr std::size_t kHelloSize = 320;
inline constexpr std::size_t kReplySize = 640;
inline constexpr std::size_t kProofSize = 32;
inline constexpr std::size_t kVerdictSize = 300;
/// The first bytes of every hello ("dopt-hs1"): a server checks them first,
/// so that anything else is dropped after 8 bytes.
inline constexpr std::size_t kMagicSize = 8;

/// Client side. Throws the errors listed at the top; `peer` names the server
/// in them ("rank 0 at 10.0.0.1:29500"), op/rank name the caller.
class ClientHandshake {
 public:
  ClientHandshake(Purpose purpose, Credentials mine, std::string peer, std::string op);
  /// Step 1: the hello to send.
  const std::string& hello() const noexcept { return hello_; }
  /// Step 2 -> 3: checks the reply (kReplySize bytes) and returns the proof.
  std::string on_reply(const std::string& reply);
  /// Step 4: checks the verdict (kVerdictSize bytes).
  void on_verdict(const std::string& verdict);
  /// The server's identity from its reply.
  int server_rank() const noexcept { return server_rank_; }

 private:
  Purpose purpose_;
  Credentials mine_;
  std::string peer_, op_;
  std::string hello_, reply_;
  int server_rank_ = -1;
};

/// Server side.
class ServerHandshake {
 public:
  ServerHandshake(Purpose purpose, Credentials mine, Admit admit);
  /// True when the first kMagicSize bytes of a hello are dopt's.
  static bool magic_ok(const std::string& first_bytes);
  /// A reply (kReplySize bytes) that refuses whoever connected, with `why`,
  /// sent without reading a hello (a server out of descriptors).
  static std::string refusal_reply(const std::string& why);
  /// Step 1 -> 2: the reply to send. refused() is true when it is a refusal
  /// (send it, then close).
  std::string on_hello(const std::string& hello);
  /// Step 3 -> 4: the verdict to send; admitted() says whether to go on.
  std::string on_proof(const std::string& proof);
  bool refused() const noexcept { return refused_; }
  bool admitted() const noexcept { return admitted_; }
  /// Why the client was refused ("" when it was not).
  const std::string& refusal() const noexcept { return refusal_; }
  const PeerHello& peer() const noexcept { return peer_; }

 private:
  Purpose purpose_;
  Credentials mine_;
  Admit admit_;
  std::string hello_, reply_, refusal_;
  PeerHello peer_;
  bool refused_ = false, admitted_ = false;
  bool job_differs_ = false;  // (with a secret) checked with the proof
};

// --- blocking client ------------------------------------------------------------------

/// Outcome of connect_authenticated() that may change on a retry (nothing
/// listens yet, the address does not resolve yet, the connection was reset
/// before the server answered): the reason, for the caller's last message.
struct RetryLater {
  std::string reason;
};

/// Resolves host, connects (giving up at `deadline`), and runs the client
/// side with `handshake_timeout` for the server's answers. Returns the
/// connected socket (the caller owns it), or std::nullopt with *retry set
/// for a failure that a retry may cure. Throws the errors at the top for the
/// others. `peer` names the server in messages.
std::optional<int> connect_authenticated(const std::string& host, int port, Purpose purpose,
                                         const Credentials& mine, std::chrono::milliseconds handshake_timeout,
                                         std::chrono::steady_clock::time_point deadline, const std::string& peer,
                                         const std::string& op, RetryLater* retry);

// --- listening server -----------------------------------------------------------------

/// A listening socket whose connections get the server side of the
/// handshake on a thread of its own (many at once, each bounded by the
/// handshake timeout); a connection that passes is handed to on_ready (on
/// that thread), which owns the socket from then on. Refused connections are
/// reported through dopt::notice() (the first few of each listener), naming
/// the peer's address. At most 64 handshakes run at once; a newcomer beyond
/// that takes the place of the oldest connection that has not sent its
/// whole hello (so processes that connect and send nothing, or a byte at a
/// time, cannot keep the ranks out), else it is closed. A process out of
/// file descriptors (EMFILE) or memory notes it once and still answers each
/// connecting process, with a refusal naming the cause ("the process of rank
/// 0 cannot take connections: Too many open files (... ulimit -n, is 20)"),
/// so the connecting rank blames this one.
class AuthListener {
 public:
  struct Options {
    /// Numeric address or host name; "0.0.0.0" / "::" = every interface.
    std::string bind_addr = "127.0.0.1";
    int port = 0;  // 0: the kernel picks one, or one of [port_lo, port_hi]
    int port_lo = 0, port_hi = 0;  // DOPT_PORT_RANGE (LaunchEnv::port_range_*); 0: none
    Purpose purpose = Purpose::control;
    Credentials credentials;
    std::chrono::milliseconds handshake_timeout{kDefaultHandshakeTimeoutMs};
    Admit admit;                                         // optional
    std::function<void(int fd, const PeerHello&)> on_ready;  // required
    /// Names the listener in notes ("rank 0's rendezvous").
    std::string what = "a dopt port";
  };
  /// Binds and listens (SO_REUSEADDR). Throws IOError naming the address and
  /// port when that fails (e.g. the port is in use).
  explicit AuthListener(Options options);
  ~AuthListener();
  AuthListener(const AuthListener&) = delete;
  AuthListener& operator=(const AuthListener&) = delete;

  std::uint16_t port() const noexcept;
  /// Stops listening and drops the handshakes in progress; joins the thread.
  /// Idempotent; not from on_ready.
  void close();

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

/// The ports a listener tries in turn: {port} when port != 0 or there is no
/// range (lo == 0; {0} lets the kernel pick), else every port of [lo, hi]
/// once, starting at a random one (ranks on one host spread over the range).
std::vector<int> listen_ports(int port, int lo, int hi);

/// "no free port in DOPT_PORT_RANGE=lo-hi on ADDR (...)" for listeners that
/// tried every port of the range; "" when there is no range.
std::string port_range_text(int lo, int hi);

/// The address a rank's listeners bind to and the one its peers connect to.
struct BindPlan {
  std::string bind;       // "127.0.0.1", "10.0.0.5", "0.0.0.0"
  std::string advertise;  // what peers connect to (an address or a host name)
  bool wildcard = false;  // bind is every interface
};

/// From env: DOPT_BIND_ADDR, else DOPT_SOCKET_IFNAME's address (IPv4, else a
/// global IPv6 one, else a link-local IPv6 one as "fe80::..%ifname"), else
/// the loopback address MASTER_ADDR resolves to when it is loopback here
/// ("127.0.1.1" for a host's own name on Debian) - but every interface when
/// MASTER_ADDR is a host name (not an address, not "localhost") and the job
/// spans hosts (world_size > local_world_size: the other hosts resolve the
/// name to this host's address) - else the local address the kernel routes
/// MASTER_ADDR through (IPv4 or IPv6). advertise: DOPT_ADVERTISE_ADDR, else the bind
/// address, else (every interface) the address the kernel routes MASTER_ADDR
/// through, else this host's name. Throws ValueError for an interface
/// without an address or that does not exist.
BindPlan choose_bind_address(const LaunchEnv& env);

}  // namespace dopt::net
