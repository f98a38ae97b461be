#pragma once
// dopt::transport::TcpMesh: the inter-host data plane (Boost.Asio TCP).
//
// Every pair of ranks is joined by one control connection, which carries
// every message's header and the small messages whole, and by `streams` data
// connections (TcpMeshOptions::streams, DOPT_TCP_STREAMS), across which the
// payload of a large message is striped (TcpMeshOptions::stripe_min_bytes):
// piece i of a message goes on data connection i. Data connection k of every
// peer is served by its own I/O thread (so the kernel's copies of the pieces
// run in parallel); the control connections, the bookkeeping and every
// completion callback run on the one I/O thread of the mesh, or on a thread
// that waits and drives the mesh meanwhile (drive()). CAF carries only
// control messages; the collective algorithms over this mesh live in
// actors/dopt/actors/internal/ring.hpp.
//
// Setup (every rank, in this order):
//   1. auto l = TcpMesh::listen("0.0.0.0");      // binds an ephemeral port
//   2. exchange "host:" + std::to_string(l.port()) through the control plane
//      (the rendezvous), so every rank knows every rank's endpoint;
//   3. TcpMesh mesh(rank, world, std::move(l), endpoints, timeout);
//      blocks until this rank is connected to every other rank. Rank i
//      connects to every rank j > i and accepts every rank j < i; every
//      connection first passes dopt's handshake (handshake.hpp, purpose
//      "data port", TcpMeshOptions::credentials: the same job id, and proof
//      of the job's secret when there is one; a connection that fails it is
//      dropped and reported through dopt::notice(), one refused by a peer
//      is fatal), then each side sends a hello carrying (rank, world size,
//      connection index, streams) and checks the other's (both sides must
//      use the same number of streams: IOError naming both otherwise).
//      Connections get TCP_NODELAY; data connections get socket_buffer_bytes
//      as SO_SNDBUF/SO_RCVBUF. A refused connection is retried until
//      `timeout`. Failure throws (and closes everything it opened):
//        TimeoutError  - a peer was not connected in time; names every missing
//                        peer rank, its endpoint and the last error seen;
//        IOError       - an endpoint that cannot be parsed or resolved, a hello
//                        from the wrong rank / world size, two connections
//                        claiming one rank;
//        ValueError / AuthenticationError - a peer refused this rank's
//                        handshake (another job, a missing or wrong secret).
//      The listener must stay alive between 1 and 3 (peers may connect early:
//      the kernel queues them in the listen backlog).
//
// Messaging (after construction):
//   send(peer, tag, data, n, done) / recv(peer, tag, data, n, done).
//   * Matching: the k-th send to peer p with tag t matches p's k-th recv from
//     this rank with tag t (FIFO per (peer, direction, tag)). Messages with
//     different tags never block each other: a message that arrives before
//     its recv is posted is read into a buffer the mesh allocates (and copied
//     into the recv buffer later), so the socket never stalls on it. A recv
//     that is posted before its message arrives receives straight into the
//     caller's buffer (no copy). Concurrent collectives therefore need
//     distinct tags, and each collective must post its sends per tag in a
//     deterministic order; the ring algorithms do.
//   * The recvs of one (peer, tag) complete in the order of their messages
//     (a striped message's recv holds back the completions of the recvs
//     matched after it on its tag, not those of other tags).
//   * Calls take effect in the order they are made from one thread; they may be
//     made from any thread (also from completion callbacks).
//   * Flow control: a send is written straight from the caller's buffer (no
//     copy: one writev of header and payload, or of a piece's header and the
//     piece); TCP back-pressure throttles the writer. Sends to one peer are
//     written one batch at a time (small queued messages are coalesced into one
//     writev). Unexpected messages are buffered without limit: only send what
//     the peer will receive. The pieces of a large message are received
//     straight into the recv buffer when the recv was posted before the
//     message's header arrived (into the mesh's buffer otherwise).
//   * done(nullptr) on success, done(exception_ptr) on failure, exactly once,
//     on the thread that runs the mesh's I/O at that moment (its I/O thread,
//     or a thread inside drive()) and never from inside send()/recv().
//     For a send, success means the bytes were handed to the kernel: the
//     buffer may be reused, it does not mean the peer has received them.
//     The buffer must stay valid until done runs. Callbacks must not block
//     and must not throw (std::terminate); they run on the one thread that
//     serves every connection at that moment.
//   * aux: every message carries a 32-bit word chosen by the sender (send's
//     `aux`), handed to the receiver through recv's `aux_out` (written before
//     done runs). The ring algorithms use it to mark forwarded data that is
//     not valid because an earlier hop failed.
//   * Errors: a recv whose message has a different size fails with
//     CollectiveMismatchError (the connection stays usable). When any
//     connection to a peer fails (end of stream, reset, write error, also in
//     the middle of a striped message) or
//     fail_peer() is called, every pending and later operation with that peer
//     fails with PeerLostError "connection to rank P lost: <reason>" (the error's
//     rank() is this rank); messages that had fully arrived before stay
//     receivable. TcpMeshOptions::on_peer_lost is told once per lost peer.
//   * close() (also the destructor) fails every pending operation with
//     StateError, closes all sockets and joins the I/O thread; it never waits
//     for peers, so it cannot hang on dead ones. It must not be called from a
//     completion callback (StateError). send()/recv() after close() throw
//     StateError.
//
// Wire format (host byte order: all ranks must share it), on the control
// connection per message: a 40-byte header {u32 magic, u32 aux, u64 tag.hi,
// u64 tag.lo, u64 length, u32 pieces, u32 seq}, then, when pieces == 0, the
// `length` payload bytes. When pieces > 0 the payload is cut into `pieces`
// pieces [length*i/pieces, length*(i+1)/pieces), and piece i travels on data
// connection i as a 16-byte header {u32 magic, u32 seq, u64 piece length} and
// the piece's bytes; seq numbers the striped messages per peer and direction,
// and each data connection carries its pieces in the order of the headers.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dopt/runtime/internal/buffer_pool.hpp"
#include "dopt/runtime/internal/handshake.hpp"

namespace dopt::transport {

/// Message tag. hi: which operation (e.g. a collective's id); lo: which
/// message stream inside it. Compared as a pair.
struct Tag {
  std::uint64_t hi = 0;
  std::uint64_t lo = 0;
  friend bool operator==(const Tag&, const Tag&) = default;
  friend auto operator<=>(const Tag&, const Tag&) = default;
};

/// Called exactly once per operation; nullptr on success.
using Completion = std::function<void(std::exception_ptr)>;

struct TcpMeshOptions {
  /// Data connections per pair of ranks (each data connection index served by
  /// an I/O thread of its own); 0: every message travels whole on the control
  /// connection. -1: DOPT_TCP_STREAMS when set, else 2. At most 16; every rank
  /// must use the same value. ValueError for a bad value or variable.
  int streams = -1;
  /// Messages of at least this many bytes are striped, in
  /// min(streams, bytes / stripe_min_bytes) pieces; smaller ones travel
  /// whole on the control connection. 0: DOPT_TCP_STRIPE_MIN when set, else
  /// 256 KiB where this process may run on at least 4 CPUs (its affinity
  /// mask), else no striping. A sender's choice: ranks may differ.
  std::size_t stripe_min_bytes = 0;
  /// SO_SNDBUF / SO_RCVBUF in bytes of the data connections (of every
  /// connection when streams == 0); 0: DOPT_TCP_SOCKET_BUFFER when set, else
  /// Linux's autotuning (which, on loopback, measured as fast as fixed 1-4 MiB
  /// buffers).
  std::size_t socket_buffer_bytes = 0;
  /// Microseconds the mesh's I/O thread keeps polling its sockets after the
  /// last event before it sleeps: saves the wake-ups of a message that
  /// arrives in pieces, and costs that much CPU after each burst of traffic.
  /// -1: DOPT_TCP_POLL_US when set, else TcpMesh::default_poll_us(ranks_on_host)
  /// (0, never poll, when ranks_on_host is not known).
  int poll_us = -1;
  /// Whether a thread that waits for the mesh's transfers may run the
  /// mesh's I/O itself (drive()) while the I/O thread stands aside: no
  /// hand-off to the I/O thread and no wake-up of the waiter when its last
  /// transfer completes. -1: DOPT_TCP_CALLER_DRIVES (0 or 1) when set, else 1.
  int caller_drives = -1;
  /// Ranks of the job on this host, 0 when not known: poll_us's default.
  int ranks_on_host = 0;
  /// Free scratch buffers the mesh keeps for reuse (buffers()), in bytes:
  /// first writes to fresh memory fault in every page, which measured costing
  /// a 1 MiB message between two hosts several times its transfer.
  /// SIZE_MAX: DOPT_TCP_POOL_BYTES when set, else 64 MiB; 0 keeps none.
  std::size_t pool_bytes = SIZE_MAX;
  /// Told (where the callbacks run) when the connection to a peer fails, once per
  /// peer, before the pending operations' callbacks. Not called by close().
  std::function<void(int peer, std::exception_ptr why)> on_peer_lost;
  /// Job id and secret every connection presents in its handshake (rank and
  /// world size are the mesh's). Default: no job id, no secret.
  net::Credentials credentials;
  /// A replacement's mesh (a process that took a lost rank's slot in a
  /// running job): when not empty, the constructor connects to nobody and
  /// waits (until `timeout`) for these ranks, whatever their number, to
  /// connect to it (each calls reconnect_peer with this rank's endpoint);
  /// every other rank is lost from the start (PeerLostError). `endpoints`
  /// are not used then. Empty: the ordinary setup.
  std::vector<int> accept_from;
  /// The ordinary setup in a world with vacant slots (an elastic job that
  /// started without these ranks): nobody connects to them or waits for
  /// them, and they are lost from the start (PeerLostError) until a
  /// newcomer in the slot connects (reconnect_peer), as a replacement does.
  std::vector<int> absent;
};

/// A bound, listening TCP socket (step 1 of the setup). Move-only.
class TcpListener {
 public:
  TcpListener();
  TcpListener(TcpListener&&) noexcept;
  TcpListener& operator=(TcpListener&&) noexcept;
  ~TcpListener();

  bool valid() const noexcept { return impl_ != nullptr; }
  /// The port the kernel assigned (0 when invalid).
  std::uint16_t port() const;

  struct Impl;

 private:
  friend class TcpMesh;
  explicit TcpListener(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

class TcpMesh {
 public:
  /// Binds bind_host (a numeric address or a host name; "0.0.0.0" = every IPv4
  /// interface, "::" = every interface) on an ephemeral port and listens.
  /// Throws IOError naming the host.
  static TcpListener listen(const std::string& bind_host = "0.0.0.0");
  /// The same on a port of [port_lo, port_hi] (DOPT_PORT_RANGE; tried from a
  /// random one on; 0, 0: ephemeral). Throws IOError "no free port in
  /// DOPT_PORT_RANGE=..." when every port of the range is taken.
  static TcpListener listen(const std::string& bind_host, int port_lo, int port_hi);

  /// Connects this rank to every other rank (see the setup contract above).
  /// The options' environment defaults are read here.
  /// endpoints[r] = "host:port" of rank r ("[v6addr]:port" for IPv6);
  /// endpoints[rank] is not used. world_size == 1 makes no connections.
  /// Throws ValueError for bad arguments, TimeoutError / IOError as above.
  TcpMesh(int rank, int world_size, TcpListener&& listener,
          const std::vector<std::string>& endpoints, std::chrono::milliseconds timeout,
          TcpMeshOptions options = {});
  ~TcpMesh();
  TcpMesh(const TcpMesh&) = delete;
  TcpMesh& operator=(const TcpMesh&) = delete;

  int rank() const noexcept;
  int world_size() const noexcept;
  /// Data connections per peer in use (options and environment resolved).
  int streams() const noexcept;
  /// The I/O thread's polling time in use (TcpMeshOptions::poll_us, resolved).
  int poll_us() const noexcept;
  /// The polling time for a mesh whose host runs ranks_on_host ranks: 200 us
  /// where each rank's calling thread and I/O thread can have a CPU of their
  /// own (2 * ranks_on_host <= hardware_threads()), else 0.
  static int default_poll_us(int ranks_on_host);

  /// Sends n bytes at data to peer (!= rank()). See the messaging contract.
  void send(int peer, Tag tag, const void* data, std::size_t n, Completion done,
            std::uint32_t aux = 0);
  /// Receives the next message with this tag from peer into data (n bytes);
  /// *aux_out (when given; must stay valid until done) gets the sender's aux.
  void recv(int peer, Tag tag, void* data, std::size_t n, Completion done,
            std::uint32_t* aux_out = nullptr);
  /// Tag {0, 0}.
  void send(int peer, const void* data, std::size_t n, Completion done) {
    send(peer, Tag{}, data, n, std::move(done));
  }
  void recv(int peer, void* data, std::size_t n, Completion done) {
    recv(peer, Tag{}, data, n, std::move(done));
  }

  /// Scratch buffers kept for reuse (any thread): the mesh reads messages
  /// that arrive before their recv into them, and the collectives built on
  /// the mesh take their per-call scratch from it. Free buffers kept: up to
  /// TcpMeshOptions::pool_bytes.
  BufferPool& buffers() noexcept;

  /// Runs fn where the mesh's I/O runs (its I/O thread, or a thread inside
  /// drive()), after the operations already requested from this thread have
  /// been queued. fn must not block or throw.
  void post(std::function<void()> fn);
  /// True on the mesh's I/O thread, and on a thread inside drive() (inside
  /// callbacks and posted functions).
  bool in_io_thread() const noexcept;

  /// Runs the mesh's I/O on the calling thread until done() returns true,
  /// calling check() about every 2 ms (an exception from it ends the drive
  /// and propagates); meanwhile the I/O thread stands aside, so completion
  /// callbacks and posted functions (of every user of the mesh) run on this
  /// thread. Polls for poll_us() after each event, then sleeps in epoll.
  /// done() is called on this thread, also between callbacks: it must not
  /// block. Returns false at once, having done nothing, where this thread
  /// cannot drive: another thread is driving, it is called from a callback,
  /// the mesh is closed or stopped, or TcpMeshOptions::caller_drives is 0;
  /// the caller then waits as it would otherwise. Returns true once done()
  /// is true or the mesh has stopped. After a drive the I/O thread stays
  /// aside for 1 ms more (the next call's driver finds it out of the way);
  /// what arrives meanwhile waits in the sockets for the next driver or the
  /// I/O thread.
  bool drive(const std::function<bool()>& done, const std::function<void()>& check);

  /// Breaks the connection to peer (e.g. after a control-plane timeout):
  /// pending and later operations with it fail with PeerLostError carrying
  /// `why`'s message. The peer sees end of stream.
  void fail_peer(int peer, const std::string& why);
  /// True once the connection to peer has failed.
  bool peer_lost(int peer) const;

  /// A member's side of a replacement (any thread; returns at once): connects
  /// to the new process of rank `peer` at endpoint ("host:port" of its mesh,
  /// built with TcpMeshOptions::accept_from), every connection with the
  /// setup's handshake and hello, on a thread of its own, within timeout.
  /// Operations with peer requested meanwhile wait for the outcome. Once
  /// connected, peer's connections are the new ones (the old ones fail first
  /// where they had not: PeerLostError to what was pending on them) and its
  /// messages start afresh. A failure is told through dopt::notice() and
  /// leaves peer lost. close() stops an attempt in progress.
  void reconnect_peer(int peer, const std::string& endpoint, std::chrono::milliseconds timeout);

  /// Fails pending operations with StateError, closes the sockets and joins
  /// the I/O thread. Idempotent. Not from a completion callback.
  void close();

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace dopt::transport
