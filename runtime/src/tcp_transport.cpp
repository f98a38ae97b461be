#include "dopt/runtime/tcp_transport.hpp"

#include <array>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <future>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include <boost/asio.hpp>

#include "dopt/runtime/error.hpp"
#include "dopt/runtime/notice.hpp"

namespace dopt::transport {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

namespace {

constexpr std::uint32_t k_magic = 0x32745064u;        // "dPt2"
constexpr std::uint32_t k_piece_magic = 0x70745064u;  // "dPtp"
constexpr std::uint32_t k_hello_magic = 0x6f6c6548u;  // "Helo"
constexpr std::uint32_t k_version = 2;
constexpr int k_default_streams = 2;
constexpr int k_max_streams = 16;
constexpr std::size_t k_default_stripe_min = 256 * 1024;
constexpr const char* k_op = "tcp mesh";
// Queued messages coalesced into one writev: at most this many, and small ones.
constexpr std::size_t k_max_batch = 32;
constexpr std::size_t k_batch_bytes = 256 * 1024;

struct Header {
  std::uint32_t magic;
  std::uint32_t aux;
  std::uint64_t hi;
  std::uint64_t lo;
  std::uint64_t len;
  std::uint32_t pieces;  // 0: the payload follows; else striped over the data connections
  std::uint32_t seq;     // striped messages: their number (per peer and direction)
};
static_assert(sizeof(Header) == 40);

// Before each piece of a striped message on a data connection.
struct PieceHeader {
  std::uint32_t magic;
  std::uint32_t seq;
  std::uint64_t len;
};
static_assert(sizeof(PieceHeader) == 16);

struct Hello {
  std::uint32_t magic;
  std::uint32_t version;
  std::int32_t rank;
  std::int32_t world;
  std::int32_t conn;     // 0: control connection; k > 0: data connection k - 1
  std::int32_t streams;  // data connections per pair on the sender's side
};
static_assert(sizeof(Hello) == 24);

// Piece i of a message of len bytes cut into `pieces`: [offset, offset + size).
std::pair<std::size_t, std::size_t> piece_of(std::size_t len, std::uint32_t pieces, std::uint32_t i) {
  const std::size_t lo = std::size_t((unsigned __int128)len * i / pieces);
  const std::size_t hi = std::size_t((unsigned __int128)len * (i + 1) / pieces);
  return {lo, hi - lo};
}

// An integer setting from the environment (K, M, G suffixes: binary units).
long long env_setting(const char* name, long long lo, long long hi, long long fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  errno = 0;
  long long x = std::strtoll(v, &end, 10);
  bool ok = errno == 0 && end != v;
  if (ok && *end) {
    const char u = *end++;
    const int shift = (u == 'K' || u == 'k') ? 10 : (u == 'M' || u == 'm') ? 20 : (u == 'G' || u == 'g') ? 30 : -1;
    if (shift < 0 || (*end && !((*end == 'i' || *end == 'B') && (end[1] == 0 || (end[1] == 'B' && !end[2])))))
      ok = false;
    else
      x <<= shift;
  }
  if (!ok || x < lo || x > hi)
    throw ValueError(k_op, std::string(name) + "=\"" + v + "\" is not a whole number in [" + std::to_string(lo) +
                               ", " + std::to_string(hi) + "]");
  return x;
}

std::string describe(const boost::system::error_code& ec) {
  if (ec == asio::error::eof) return "end of stream (the peer closed the connection)";
  return ec.message();
}

void call(const Completion& cb, std::exception_ptr e) noexcept { cb(std::move(e)); }

struct Endpoint {
  std::string host;
  std::string port;
};

Endpoint parse_endpoint(const std::string& s, int rank_of, int me) {
  auto bad = [&](const std::string& why) {
    return IOError(k_op, "endpoint \"" + s + "\" of rank " + std::to_string(rank_of) + " " + why, me);
  };
  const auto colon = s.rfind(':');
  if (colon == std::string::npos || colon + 1 >= s.size()) throw bad("is not host:port");
  std::string host = s.substr(0, colon);
  std::string port = s.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (host.empty()) throw bad("has no host");
  for (char c : port)
    if (c < '0' || c > '9') throw bad("has a non-numeric port");
  return {host, port};
}

}  // namespace

// --- listener -------------------------------------------------------------------

struct TcpListener::Impl {
  asio::io_context io{1};
  tcp::acceptor acceptor{io};
  std::uint16_t port = 0;
};

TcpListener::TcpListener() = default;
TcpListener::TcpListener(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TcpListener::TcpListener(TcpListener&&) noexcept = default;
TcpListener& TcpListener::operator=(TcpListener&&) noexcept = default;
TcpListener::~TcpListener() = default;
std::uint16_t TcpListener::port() const { return impl_ ? impl_->port : 0; }

TcpListener TcpMesh::listen(const std::string& bind_host) { return listen(bind_host, 0, 0); }

TcpListener TcpMesh::listen(const std::string& bind_host, int port_lo, int port_hi) {
  auto impl = std::make_unique<TcpListener::Impl>();
  boost::system::error_code ec;
  tcp::resolver resolver(impl->io);
  auto results = resolver.resolve(bind_host, "0", tcp::resolver::passive, ec);
  if (ec || results.empty())
    throw IOError(k_op, "cannot resolve the bind address \"" + bind_host + "\": " + ec.message());
  std::string last;
  const std::vector<int> ports = net::listen_ports(0, port_lo, port_hi);
  for (int port : ports) {
    for (const auto& entry : results) {
      tcp::acceptor& a = impl->acceptor;
      tcp::endpoint ep = entry.endpoint();
      ep.port(static_cast<std::uint16_t>(port));
      a.open(ep.protocol(), ec);
      if (ec) { last = ec.message(); continue; }
      a.set_option(asio::socket_base::reuse_address(true), ec);
      a.bind(ep, ec);
      if (!ec) a.listen(asio::socket_base::max_listen_connections, ec);
      if (ec) {
        last = ec.message();
        boost::system::error_code ignore;
        a.close(ignore);
        continue;
      }
      impl->port = a.local_endpoint().port();
      return TcpListener(std::move(impl));
    }
  }
  if (ports.size() > 1)
    throw IOError(k_op, net::port_range_text(port_lo, port_hi) + " on \"" + bind_host +
                            "\" (every port is in use; last error: " + last + ")");
  throw IOError(k_op, "cannot listen on \"" + bind_host + "\": " + last);
}

// --- mesh -----------------------------------------------------------------------

struct TcpMesh::Impl {
  struct SendOp {
    Tag tag;
    const void* data;
    std::size_t n;
    Completion done;
    std::uint32_t aux;
    std::uint32_t pieces = 0;  // > 0: only the header goes on the control connection
    std::uint32_t seq = 0;
  };
  struct RecvOp {
    void* data;
    std::size_t n;
    Completion done;
    std::uint32_t* aux_out;
  };
  // A message read before (or while) its recv was posted.
  struct Early {
    std::unique_ptr<std::byte[]> data;
    std::size_t n = 0;
    std::uint32_t aux = 0;
    bool complete = false;
    bool has_waiter = false;
    RecvOp waiter;
  };
  // One piece of a striped message on a data connection. done runs on the
  // mesh's I/O thread with "" (success) or why it failed.
  using PieceDone = std::function<void(const std::string&)>;
  struct Piece {
    PieceHeader hdr;
    std::byte* data;
    std::size_t n;
    PieceDone done;
  };
  // A data connection; after setup, touched only on its lane's thread.
  struct DataConn {
    std::unique_ptr<tcp::socket> sock;
    std::deque<Piece> wq, rq;  // front is in flight while writing / reading
    bool writing = false, reading = false, dead = false;
    std::string dead_why;
    PieceHeader rhdr{};
  };
  // Data connection index k of every peer is served by lane k's thread.
  struct Lane {
    asio::io_context io{1};
    std::optional<asio::executor_work_guard<asio::io_context::executor_type>> guard;
    std::thread thread;
  };
  // A striped message in flight (I/O thread): its parts left, and what runs
  // when the last one is done.
  struct Striped {
    int left = 0;
    bool failed = false;
    std::function<void(bool failed)> finish;
  };
  // A recv matched to its message, waiting to complete in the order of the
  // messages of its tag (a striped message completes later than a small one
  // sent after it on the same tag; callers rely on FIFO completion per tag).
  struct Slot {
    Completion done;
    std::exception_ptr error;
    bool ready = false;
  };
  struct Peer {
    int rank = -1;
    std::unique_ptr<tcp::socket> sock;  // the control connection
    std::vector<std::unique_ptr<DataConn>> data;
    std::exception_ptr lost;
    std::atomic<bool> lost_flag{false};
    // send side
    std::deque<SendOp> sendq;
    std::vector<SendOp> batch;
    std::vector<Header> whdrs;
    std::vector<asio::const_buffer> wbufs;
    bool writing = false;
    std::uint32_t send_seq = 0;
    // receive side
    Header rhdr{};
    std::uint32_t recv_seq = 0;
    std::map<Tag, std::deque<RecvOp>> posted;
    std::map<Tag, std::deque<std::shared_ptr<Early>>> early;
    std::map<Tag, std::deque<std::shared_ptr<Slot>>> inorder;
  };

  std::unique_ptr<TcpListener::Impl> lis;  // owns the io_context (declared first: dies last)
  asio::io_context& io;
  int rank;
  int world;
  TcpMeshOptions opts;
  int streams;
  std::vector<std::unique_ptr<Lane>> lanes;  // before peers: their sockets die first
  std::vector<std::unique_ptr<Peer>> peers;

  std::mutex m;            // guards closed_ and posting from foreign threads
  bool closed_ = false;    // no more operations accepted from foreign threads
  bool closing_ = false;   // I/O thread: shutdown in progress
  std::exception_ptr closed_err;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> guard;
  std::thread thread;

  Impl(std::unique_ptr<TcpListener::Impl> l, int r, int w, TcpMeshOptions o)
      : lis(std::move(l)), io(lis->io), rank(r), world(w), opts(std::move(o)), streams(opts.streams) {
    for (int k = 0; k < streams; ++k) lanes.push_back(std::make_unique<Lane>());
    peers.resize(world);
    for (int i = 0; i < world; ++i) {
      peers[i] = std::make_unique<Peer>();
      peers[i]->rank = i;
      for (int k = 0; k < streams; ++k) peers[i]->data.push_back(std::make_unique<DataConn>());
    }
    closed_err = std::make_exception_ptr(
        StateError(k_op, "the mesh was closed while the operation was pending", rank));
  }

  ~Impl() {
    boost::system::error_code ec;
    for (auto& p : peers) {
      if (p->sock) p->sock->close(ec);
      for (auto& c : p->data)
        if (c->sock) c->sock->close(ec);
    }
  }

  void deliver(Completion cb, std::exception_ptr e) {
    asio::post(io, [cb = std::move(cb), e = std::move(e)]() mutable { call(cb, std::move(e)); });
  }

  // conn 0: the control connection (its buffers are tuned only when it is the
  // only one); conn k > 0: a data connection.
  void set_socket_options(tcp::socket& s, int conn) {
    boost::system::error_code ec;
    s.set_option(tcp::no_delay(true), ec);
    if (opts.socket_buffer_bytes > 0 && (conn > 0 || streams == 0)) {
      s.set_option(asio::socket_base::send_buffer_size(int(opts.socket_buffer_bytes)), ec);
      s.set_option(asio::socket_base::receive_buffer_size(int(opts.socket_buffer_bytes)), ec);
    }
  }

  // ---- setup (runs the io_context on the constructing thread) -------------------
  void establish(const std::vector<std::string>& endpoints, std::chrono::milliseconds timeout);
  bool connected(int peer, int conn) const {
    return conn == 0 ? bool(peers[peer]->sock) : bool(peers[peer]->data[conn - 1]->sock);
  }
  bool fully_connected(int peer) const {
    for (int c = 0; c <= streams; ++c)
      if (!connected(peer, c)) return false;
    return true;
  }

  // ---- I/O thread ------------------------------------------------------------
  std::exception_ptr failure(Peer& p) const { return p.lost ? p.lost : closed_err; }

  void lose(Peer& p, const std::string& why) {
    if (p.lost || closing_) return;
    p.lost = std::make_exception_ptr(PeerLostError(
        k_op, "connection to rank " + std::to_string(p.rank) + " lost: " + why, rank));
    p.lost_flag = true;
    boost::system::error_code ec;
    if (p.sock) {
      p.sock->shutdown(tcp::socket::shutdown_both, ec);
      p.sock->close(ec);
    }
    kill_data(p, "the connection to rank " + std::to_string(p.rank) + " was lost");
    if (opts.on_peer_lost) opts.on_peer_lost(p.rank, p.lost);
    fail_queued(p, p.lost);
  }

  // Closes p's data connections (on their lanes); their pieces in flight fail.
  void kill_data(Peer& p, const std::string& why) {
    for (int k = 0; k < streams; ++k) {
      DataConn* c = p.data[std::size_t(k)].get();
      asio::post(lanes[std::size_t(k)]->io, [this, c, why] { lane_kill(*c, why); });
    }
  }

  // Fails what is queued but not in flight (in-flight ops fail in their handlers).
  void fail_queued(Peer& p, const std::exception_ptr& e) {
    for (auto& op : p.sendq) deliver(std::move(op.done), e);
    p.sendq.clear();
    for (auto& [tag, q] : p.posted)
      for (auto& op : q) deliver(std::move(op.done), e);
    p.posted.clear();
  }

  void shutdown_all() {
    closing_ = true;
    for (auto& pp : peers) {
      Peer& p = *pp;
      boost::system::error_code ec;
      if (p.sock) p.sock->close(ec);
      kill_data(p, "the mesh was closed");
      fail_queued(p, p.lost ? p.lost : closed_err);
    }
  }

  // A part of a striped message is done (why: "" on success; a reason to
  // give up on the peer, or "-" for a failure already accounted for).
  void part_done(Peer& p, const std::shared_ptr<Striped>& st, const std::string& why) {
    if (!why.empty()) {
      st->failed = true;
      if (why != "-") lose(p, why);
    }
    if (--st->left == 0) st->finish(st->failed);
  }

  std::uint32_t pieces_for(std::size_t n) const {
    if (streams == 0 || n < opts.stripe_min_bytes) return 0;
    return std::uint32_t(std::min<std::size_t>(std::size_t(streams), n / opts.stripe_min_bytes));
  }

  void do_send(int peer, SendOp op) {
    Peer& p = *peers[peer];
    if (closing_ || p.lost) return deliver(std::move(op.done), failure(p));
    const std::uint32_t pieces = pieces_for(op.n);
    if (pieces > 0) {
      // The header on the control connection, piece i on data connection i,
      // each written straight from the caller's buffer.
      auto st = std::make_shared<Striped>();
      st->left = int(pieces) + 1;
      st->finish = [this, &p, done = std::move(op.done)](bool failed) mutable {
        deliver(std::move(done), failed ? failure(p) : nullptr);
      };
      op.pieces = pieces;
      op.seq = p.send_seq++;
      op.done = [this, &p, st](std::exception_ptr e) { part_done(p, st, e ? "-" : ""); };
      const auto* base = static_cast<const std::byte*>(op.data);
      for (std::uint32_t i = 0; i < pieces; ++i) {
        const auto [off, len] = piece_of(op.n, pieces, i);
        DataConn* c = p.data[i].get();
        Piece pc{PieceHeader{k_piece_magic, op.seq, len}, const_cast<std::byte*>(base + off), len,
                 [this, &p, st, i](const std::string& why) {
                   part_done(p, st, why.empty() ? why : "data connection " + std::to_string(i) + ": " + why);
                 }};
        asio::post(lanes[i]->io, [this, c, pc = std::move(pc)]() mutable { lane_send(*c, std::move(pc)); });
      }
    }
    p.sendq.push_back(std::move(op));
    if (!p.writing) start_write(p);
  }

  void start_write(Peer& p) {
    p.batch.clear();
    p.whdrs.clear();
    p.wbufs.clear();
    std::size_t bytes = 0;
    while (!p.sendq.empty() && p.batch.size() < k_max_batch) {
      const std::size_t n = p.sendq.front().pieces ? 0 : p.sendq.front().n;
      if (!p.batch.empty() && bytes + n > k_batch_bytes) break;
      bytes += n;
      p.batch.push_back(std::move(p.sendq.front()));
      p.sendq.pop_front();
    }
    p.whdrs.reserve(p.batch.size());
    for (const SendOp& op : p.batch) {
      p.whdrs.push_back(Header{k_magic, op.aux, op.tag.hi, op.tag.lo, op.n, op.pieces, op.seq});
      p.wbufs.emplace_back(&p.whdrs.back(), sizeof(Header));
      if (op.n > 0 && op.pieces == 0) p.wbufs.emplace_back(op.data, op.n);
    }
    p.writing = true;
    asio::async_write(*p.sock, p.wbufs, [this, &p](const boost::system::error_code& ec, std::size_t) {
      p.writing = false;
      if (ec || closing_ || p.lost) {
        if (ec) lose(p, "write failed: " + describe(ec));
        for (auto& op : p.batch) deliver(std::move(op.done), failure(p));
        p.batch.clear();
        return;
      }
      for (auto& op : p.batch) deliver(std::move(op.done), nullptr);
      p.batch.clear();
      if (!p.sendq.empty()) start_write(p);
    });
  }

  // A recv matched to a message of tag: its completion waits for the recvs
  // matched before it on the tag.
  Completion ordered(Peer& p, Tag tag, Completion done) {
    auto slot = std::make_shared<Slot>();
    slot->done = std::move(done);
    p.inorder[tag].push_back(slot);
    return [this, &p, tag, slot](std::exception_ptr e) {
      slot->error = std::move(e);
      slot->ready = true;
      auto it = p.inorder.find(tag);
      if (it == p.inorder.end()) return;
      auto& q = it->second;
      while (!q.empty() && q.front()->ready) {
        call(q.front()->done, std::move(q.front()->error));
        q.pop_front();
      }
      if (q.empty()) p.inorder.erase(it);
    };
  }

  void do_recv(int peer, Tag tag, RecvOp op) {
    Peer& p = *peers[peer];
    auto e = p.early.find(tag);
    if (e != p.early.end()) {
      op.done = ordered(p, tag, std::move(op.done));
      std::shared_ptr<Early> msg = std::move(e->second.front());
      e->second.pop_front();
      if (e->second.empty()) p.early.erase(e);
      if (!msg->complete) {  // still arriving: it completes this recv when done
        msg->has_waiter = true;
        msg->waiter = std::move(op);
        return;
      }
      return finish_early(p, tag, *msg, std::move(op));
    }
    if (closing_ || p.lost) return deliver(std::move(op.done), failure(p));
    p.posted[tag].push_back(std::move(op));
  }

  void finish_early(Peer& p, Tag tag, Early& msg, RecvOp op) {
    if (msg.n != op.n) return deliver(std::move(op.done), mismatch(p, tag, msg.n, op.n));
    if (msg.n > 0) std::memcpy(op.data, msg.data.get(), msg.n);
    if (op.aux_out) *op.aux_out = msg.aux;
    deliver(std::move(op.done), nullptr);
  }

  // An early message that failed to arrive: it leaves the queue (when still
  // there) and fails the recv that waits for it.
  void drop_early(Peer& p, Tag tag, const std::shared_ptr<Early>& msg) {
    auto e = p.early.find(tag);
    if (e != p.early.end()) {
      auto& q = e->second;
      for (auto i = q.begin(); i != q.end(); ++i)
        if (*i == msg) {
          q.erase(i);
          break;
        }
      if (q.empty()) p.early.erase(e);
    }
    if (msg->has_waiter) {
      msg->has_waiter = false;
      deliver(std::move(msg->waiter.done), failure(p));
    }
  }

  std::exception_ptr mismatch(const Peer& p, Tag tag, std::size_t got, std::size_t want) const {
    return std::make_exception_ptr(CollectiveMismatchError(
        k_op,
        "message from rank " + std::to_string(p.rank) + " (tag " + std::to_string(tag.hi) + "/" +
            std::to_string(tag.lo) + ") has " + std::to_string(got) +
            " bytes, the matching recv expects " + std::to_string(want),
        rank));
  }

  void read_header(Peer& p) {
    asio::async_read(*p.sock, asio::buffer(&p.rhdr, sizeof(Header)),
                     [this, &p](const boost::system::error_code& ec, std::size_t) {
                       if (closing_ || p.lost) return;
                       if (ec) return lose(p, describe(ec));
                       if (p.rhdr.magic != k_magic) return lose(p, "corrupt message header");
                       if (p.rhdr.pieces > 0) return on_striped_header(p);
                       on_header(p);
                     });
  }

  void on_header(Peer& p) {
    const Tag tag{p.rhdr.hi, p.rhdr.lo};
    const std::size_t len = p.rhdr.len;
    auto it = p.posted.find(tag);
    if (it != p.posted.end()) {
      RecvOp op = std::move(it->second.front());
      it->second.pop_front();
      if (it->second.empty()) p.posted.erase(it);
      op.done = ordered(p, tag, std::move(op.done));
      if (op.n == len) {
        if (op.aux_out) *op.aux_out = p.rhdr.aux;
        if (len == 0) {
          deliver(std::move(op.done), nullptr);
          return read_header(p);
        }
        auto shared = std::make_shared<RecvOp>(std::move(op));
        asio::async_read(*p.sock, asio::buffer(shared->data, len),
                         [this, &p, shared](const boost::system::error_code& ec, std::size_t) {
                           if (ec || closing_ || p.lost) {
                             if (ec && !closing_) lose(p, describe(ec));
                             return deliver(std::move(shared->done), failure(p));
                           }
                           deliver(std::move(shared->done), nullptr);
                           read_header(p);
                         });
        return;
      }
      // Wrong size: the recv fails, the payload is read and dropped.
      deliver(std::move(op.done), mismatch(p, tag, len, op.n));
      return read_early(p, tag, len, /*queue=*/false);
    }
    read_early(p, tag, len, /*queue=*/true);
  }

  // The header of a striped message: its pieces are read on the data
  // connections (straight into a posted recv's buffer when there is one),
  // while this connection reads on.
  void on_striped_header(Peer& p) {
    const Tag tag{p.rhdr.hi, p.rhdr.lo};
    const std::size_t len = p.rhdr.len;
    const std::uint32_t pieces = p.rhdr.pieces, seq = p.rhdr.seq;
    if (pieces > std::uint32_t(streams) || pieces > len || seq != p.recv_seq)
      return lose(p, "corrupt message header (striped message " + std::to_string(seq) + " in " +
                         std::to_string(pieces) + " pieces; expected message " + std::to_string(p.recv_seq) +
                         " in at most " + std::to_string(streams) + ")");
    ++p.recv_seq;
    auto st = std::make_shared<Striped>();
    st->left = int(pieces);
    std::byte* dest = nullptr;
    auto it = p.posted.find(tag);
    if (it != p.posted.end()) {
      RecvOp op = std::move(it->second.front());
      it->second.pop_front();
      if (it->second.empty()) p.posted.erase(it);
      op.done = ordered(p, tag, std::move(op.done));
      if (op.n == len) {
        if (op.aux_out) *op.aux_out = p.rhdr.aux;
        dest = static_cast<std::byte*>(op.data);
        st->finish = [this, &p, done = std::move(op.done)](bool failed) mutable {
          deliver(std::move(done), failed ? failure(p) : nullptr);
        };
      } else {  // wrong size: the recv fails, the pieces are read and dropped
        deliver(std::move(op.done), mismatch(p, tag, len, op.n));
        std::shared_ptr<std::byte[]> junk(new std::byte[len]);
        dest = junk.get();
        st->finish = [junk](bool) {};
      }
    } else {
      auto msg = std::make_shared<Early>();
      msg->n = len;
      msg->aux = p.rhdr.aux;
      msg->data.reset(new std::byte[len]);
      p.early[tag].push_back(msg);
      dest = msg->data.get();
      st->finish = [this, &p, msg, tag](bool failed) {
        if (failed) return drop_early(p, tag, msg);
        msg->complete = true;
        if (msg->has_waiter) {
          msg->has_waiter = false;
          finish_early(p, tag, *msg, std::move(msg->waiter));
        }
      };
    }
    for (std::uint32_t i = 0; i < pieces; ++i) {
      const auto [off, n] = piece_of(len, pieces, i);
      DataConn* c = p.data[i].get();
      Piece pc{PieceHeader{k_piece_magic, seq, n}, dest + off, n, [this, &p, st, i](const std::string& why) {
                 part_done(p, st, why.empty() ? why : "data connection " + std::to_string(i) + ": " + why);
               }};
      asio::post(lanes[i]->io, [this, c, pc = std::move(pc)]() mutable { lane_expect(*c, std::move(pc)); });
    }
    read_header(p);
  }

  void read_early(Peer& p, Tag tag, std::size_t len, bool queue) {
    auto msg = std::make_shared<Early>();
    msg->n = len;
    msg->aux = p.rhdr.aux;
    if (len > 0) msg->data.reset(new std::byte[len]);
    if (queue) p.early[tag].push_back(msg);
    if (len == 0) {
      msg->complete = true;
      return read_header(p);
    }
    asio::async_read(*p.sock, asio::buffer(msg->data.get(), len),
                     [this, &p, msg, tag, queue](const boost::system::error_code& ec, std::size_t) {
                       if (ec || closing_ || p.lost) {
                         if (ec && !closing_) lose(p, describe(ec));
                         if (queue) return drop_early(p, tag, msg);
                         return;
                       }
                       msg->complete = true;
                       if (msg->has_waiter) {
                         msg->has_waiter = false;
                         finish_early(p, tag, *msg, std::move(msg->waiter));
                       }
                       read_header(p);
                     });
  }

  // ---- lane threads (a data connection's socket and queues) --------------------
  void post_done(PieceDone done, std::string why) {
    asio::post(io, [done = std::move(done), why = std::move(why)] { done(why); });
  }

  // Closes c; fails its queued pieces (those in flight fail in their handlers).
  void lane_kill(DataConn& c, const std::string& why) {
    if (!c.dead) {
      c.dead = true;
      c.dead_why = why;
      boost::system::error_code ec;
      if (c.sock) {
        c.sock->shutdown(tcp::socket::shutdown_both, ec);
        c.sock->close(ec);
      }
    }
    auto fail = [&](std::deque<Piece>& q, bool busy) {
      while (q.size() > (busy ? 1u : 0u)) {
        post_done(std::move(q.back().done), c.dead_why);
        q.pop_back();
      }
    };
    fail(c.wq, c.writing);
    fail(c.rq, c.reading);
  }

  void lane_send(DataConn& c, Piece pc) {
    if (c.dead) return post_done(std::move(pc.done), c.dead_why);
    c.wq.push_back(std::move(pc));
    if (!c.writing) lane_write(c);
  }

  void lane_write(DataConn& c) {
    c.writing = true;
    Piece& pc = c.wq.front();
    const std::array<asio::const_buffer, 2> bufs{asio::buffer(&pc.hdr, sizeof(PieceHeader)),
                                                 asio::const_buffer(pc.data, pc.n)};
    asio::async_write(*c.sock, bufs, [this, &c](const boost::system::error_code& ec, std::size_t) {
      c.writing = false;
      Piece done = std::move(c.wq.front());
      c.wq.pop_front();
      if (ec || c.dead) {
        lane_kill(c, "write failed: " + describe(ec));
        return post_done(std::move(done.done), c.dead_why);
      }
      post_done(std::move(done.done), "");
      if (!c.wq.empty()) lane_write(c);
    });
  }

  void lane_expect(DataConn& c, Piece pc) {
    if (c.dead) return post_done(std::move(pc.done), c.dead_why);
    c.rq.push_back(std::move(pc));
    if (!c.reading) lane_read(c);
  }

  void lane_read(DataConn& c) {
    c.reading = true;
    Piece& pc = c.rq.front();
    const std::array<asio::mutable_buffer, 2> bufs{asio::buffer(&c.rhdr, sizeof(PieceHeader)),
                                                   asio::mutable_buffer(pc.data, pc.n)};
    asio::async_read(*c.sock, bufs, [this, &c](const boost::system::error_code& ec, std::size_t) {
      c.reading = false;
      Piece done = std::move(c.rq.front());
      c.rq.pop_front();
      std::string why;
      if (ec) why = describe(ec);
      else if (c.rhdr.magic != k_piece_magic || c.rhdr.seq != done.hdr.seq || c.rhdr.len != done.n)
        why = "corrupt piece header";
      if (!why.empty() || c.dead) {
        lane_kill(c, why.empty() ? "closed" : why);
        return post_done(std::move(done.done), c.dead_why);
      }
      post_done(std::move(done.done), "");
      if (!c.rq.empty()) lane_read(c);
    });
  }

  // ---- any thread ------------------------------------------------------------
  bool in_io_thread() const noexcept {
    if (io.get_executor().running_in_this_thread()) return true;
    for (const auto& l : lanes)
      if (l->io.get_executor().running_in_this_thread()) return true;
    return false;
  }

  template <class F>
  void submit(F&& fn) {
    if (io.get_executor().running_in_this_thread()) return fn();
    std::lock_guard<std::mutex> lock(m);
    if (closed_) throw StateError(k_op, "the mesh is closed", rank);
    asio::post(io, std::forward<F>(fn));
  }

  void check_peer(int peer, const char* what) const {
    if (peer < 0 || peer >= world || peer == rank)
      throw ValueError(std::string(k_op) + " " + what,
                       "peer " + std::to_string(peer) + " is not another rank of a world of " +
                           std::to_string(world),
                       rank);
  }

  void start_threads() {
    for (auto& l : lanes) {
      l->guard.emplace(asio::make_work_guard(l->io));
      l->thread = std::thread([lp = l.get()] { lp->io.run(); });
    }
    guard.emplace(asio::make_work_guard(io));
    for (int j = 0; j < world; ++j)
      if (j != rank) read_header(*peers[j]);
    thread = std::thread([this] { io.run(); });
  }

  void close() {
    if (in_io_thread())
      throw StateError(k_op, "close() called from a completion callback of the mesh", rank);
    std::promise<void> shut;
    {
      std::lock_guard<std::mutex> lock(m);
      if (closed_) return;
      closed_ = true;
      asio::post(io, [this, &shut] {
        shutdown_all();
        shut.set_value();
      });
    }
    // The lanes first (their failed pieces are reported to the I/O thread,
    // which runs until they are joined), then the I/O thread.
    shut.get_future().wait();
    for (auto& l : lanes) {
      l->guard.reset();
      if (l->thread.joinable()) l->thread.join();
    }
    guard.reset();
    if (thread.joinable()) thread.join();
  }
};

// ---- setup ---------------------------------------------------------------------

void TcpMesh::Impl::establish(const std::vector<std::string>& endpoints,
                              std::chrono::milliseconds timeout) {
  if (world == 1) return;
  struct Conn {
    int peer;
    int conn = 0;  // 0: control, k > 0: data connection k - 1
    Endpoint ep;
    tcp::resolver::results_type addrs;
    tcp::socket sock;
    asio::steady_timer retry;
    Hello out{}, in{};
    std::chrono::milliseconds backoff{5};
    std::unique_ptr<net::ClientHandshake> hs;
    std::string reply, proof, verdict;
    Conn(asio::io_context& io) : sock(io), retry(io) {}
  };
  struct Accepted {
    tcp::socket sock;
    Hello in{}, out{};
    std::unique_ptr<net::ServerHandshake> hs;
    std::string buf, rest, reply, verdict;
    explicit Accepted(tcp::socket s) : sock(std::move(s)) {}
  };
  net::Credentials creds = opts.credentials;
  creds.rank = rank;
  creds.world_size = world;

  // Resolve every peer we connect to first (synchronously; names a bad endpoint).
  std::vector<std::unique_ptr<Conn>> conns;
  for (int j = rank + 1; j < world; ++j) {
    const Endpoint ep = parse_endpoint(endpoints[j], j, rank);
    boost::system::error_code ec;
    tcp::resolver resolver(io);
    auto addrs = resolver.resolve(ep.host, ep.port, tcp::resolver::numeric_service, ec);
    if (ec || addrs.empty())
      throw IOError(k_op, "cannot resolve \"" + endpoints[j] + "\" of rank " + std::to_string(j) +
                              ": " + ec.message(), rank);
    for (int k = 0; k <= streams; ++k) {
      auto c = std::make_unique<Conn>(io);
      c->peer = j;
      c->conn = k;
      c->ep = ep;
      c->addrs = addrs;
      conns.push_back(std::move(c));
    }
  }

  const int expected = (world - 1) * (streams + 1);
  int have = 0;
  bool done = false;
  std::exception_ptr fatal;
  std::vector<std::string> last_error(world);
  std::vector<std::shared_ptr<Accepted>> accepting;
  asio::steady_timer deadline(io);
  tcp::acceptor& acceptor = lis->acceptor;

  auto finish = [&](std::exception_ptr e) {
    if (done) return;
    done = true;
    fatal = std::move(e);
    boost::system::error_code ec;
    deadline.cancel();
    acceptor.close(ec);
    for (auto& c : conns) {
      c->retry.cancel();
      c->sock.close(ec);
    }
    for (auto& a : accepting) a->sock.close(ec);
  };
  auto established = [&](int peer, int conn, tcp::socket&& s) {
    auto& slot = conn == 0 ? peers[peer]->sock : peers[peer]->data[std::size_t(conn - 1)]->sock;
    slot = std::make_unique<tcp::socket>(std::move(s));
    if (++have == expected) finish(nullptr);
  };
  auto streams_differ = [&](int peer, int theirs) {
    return std::make_exception_ptr(IOError(
        k_op,
        "rank " + std::to_string(peer) + " uses " + std::to_string(theirs) +
            " data connections per peer (DOPT_TCP_STREAMS), this rank " + std::to_string(streams) +
            "; every rank must use the same number",
        rank));
  };

  // Connect to every higher rank, retrying refused connections.
  std::function<void(Conn*)> try_connect;
  std::function<void(Conn*, const std::string&)> retry = [&](Conn* c, const std::string& why) {
    last_error[c->peer] = why;
    boost::system::error_code ignore;
    c->sock.close(ignore);
    c->retry.expires_after(c->backoff);
    c->backoff = std::min(c->backoff * 2, std::chrono::milliseconds(200));
    c->retry.async_wait([&, c](const boost::system::error_code& e2) {
      if (!e2 && !done) try_connect(c);
    });
  };
  // After the handshake (below): the hello.
  std::function<void(Conn*)> send_hello = [&](Conn* c) {
    c->out = Hello{k_hello_magic, k_version, rank, world, c->conn, streams};
    asio::async_write(c->sock, asio::buffer(&c->out, sizeof(Hello)),
                      [&, c](const boost::system::error_code& ec2, std::size_t) {
      if (done) return;
      if (ec2) return retry(c, "hello not sent: " + describe(ec2));
      asio::async_read(c->sock, asio::buffer(&c->in, sizeof(Hello)),
                       [&, c](const boost::system::error_code& ec3, std::size_t) {
        if (done) return;
        if (ec3) return retry(c, "no hello reply: " + describe(ec3));
        if (c->in.magic == k_hello_magic && c->in.version == k_version && c->in.streams != streams)
          return finish(streams_differ(c->peer, c->in.streams));
        if (c->in.magic != k_hello_magic || c->in.version != k_version || c->in.rank != c->peer ||
            c->in.world != world || c->in.conn != c->conn) {
          return finish(std::make_exception_ptr(IOError(
              k_op,
              "endpoint " + endpoints[c->peer] + " of rank " + std::to_string(c->peer) +
                  " answered as rank " + std::to_string(c->in.rank) + " of a world of " +
                  std::to_string(c->in.world) + " (expected rank " + std::to_string(c->peer) +
                  " of " + std::to_string(world) + ")",
              rank)));
        }
        established(c->peer, c->conn, std::move(c->sock));
      });
    });
  };
  // The client side of dopt's handshake; a refusal (or a peer that fails to
  // prove itself) is fatal, a connection that breaks is retried.
  try_connect = [&](Conn* c) {
    asio::async_connect(c->sock, c->addrs, [&, c](const boost::system::error_code& ec, const tcp::endpoint&) {
      if (done) return;
      if (ec) return retry(c, ec.message());
      set_socket_options(c->sock, c->conn);
      c->hs = std::make_unique<net::ClientHandshake>(
          net::Purpose::data, creds, "rank " + std::to_string(c->peer) + " at " + endpoints[c->peer], k_op);
      asio::async_write(c->sock, asio::buffer(c->hs->hello()), [&, c](const boost::system::error_code& e1, std::size_t) {
        if (done) return;
        if (e1) return retry(c, "handshake not sent: " + describe(e1));
        c->reply.assign(net::kReplySize, '\0');
        asio::async_read(c->sock, asio::buffer(c->reply), [&, c](const boost::system::error_code& e2, std::size_t) {
          if (done) return;
          if (e2) return retry(c, "no handshake reply: " + describe(e2));
          try {
            c->proof = c->hs->on_reply(c->reply);
          } catch (...) {
            return finish(std::current_exception());
          }
          asio::async_write(c->sock, asio::buffer(c->proof), [&, c](const boost::system::error_code& e3, std::size_t) {
            if (done) return;
            if (e3) return retry(c, "handshake proof not sent: " + describe(e3));
            c->verdict.assign(net::kVerdictSize, '\0');
            asio::async_read(c->sock, asio::buffer(c->verdict), [&, c](const boost::system::error_code& e4,
                                                                       std::size_t) {
              if (done) return;
              if (e4) return retry(c, "no handshake verdict: " + describe(e4));
              try {
                c->hs->on_verdict(c->verdict);
              } catch (...) {
                return finish(std::current_exception());
              }
              send_hello(c);
            });
          });
        });
      });
    });
  };

  // Accept every lower rank: dopt's handshake first (a connection that fails
  // it is dropped and reported, not fatal: it was not one of our peers), then
  // the hello.
  auto drop = [&](const std::shared_ptr<Accepted>& a, const std::string& why) {
    boost::system::error_code ignore;
    std::string from = "an unknown address";
    if (auto ep = a->sock.remote_endpoint(ignore); !ignore)
      from = ep.address().to_string() + ":" + std::to_string(ep.port());
    a->sock.close(ignore);
    if (!why.empty())
      notice("refused a connection from " + from + " to rank " + std::to_string(rank) + "'s data port: " + why);
  };
  std::function<void(std::shared_ptr<Accepted>)> read_hello = [&](std::shared_ptr<Accepted> a) {
    asio::async_read(a->sock, asio::buffer(&a->in, sizeof(Hello)),
                     [&, a](const boost::system::error_code& ec2, std::size_t) {
      if (done) return;
      boost::system::error_code ignore;
      if (ec2 || a->in.magic != k_hello_magic) {  // a stray client
        a->sock.close(ignore);
        return;
      }
      const int peer = a->in.rank;
      const int conn = a->in.conn;
      if (a->in.version != k_version || a->in.world != world || peer < 0 || peer >= rank ||
          (a->in.streams == streams && (conn < 0 || conn > streams))) {
        return finish(std::make_exception_ptr(IOError(
            k_op,
            "a peer connected as rank " + std::to_string(peer) + " of a world of " +
                std::to_string(a->in.world) + " (protocol " + std::to_string(a->in.version) +
                "); expected a rank below " + std::to_string(rank) + " of " + std::to_string(world),
            rank)));
      }
      const bool differ = a->in.streams != streams;
      if (!differ && connected(peer, conn))
        return finish(std::make_exception_ptr(
            IOError(k_op, "two connections claim to be rank " + std::to_string(peer), rank)));
      set_socket_options(a->sock, differ ? 0 : conn);
      a->out = Hello{k_hello_magic, k_version, rank, world, conn, streams};
      asio::async_write(a->sock, asio::buffer(&a->out, sizeof(Hello)),
                        [&, a, peer, conn, differ](const boost::system::error_code& ec3, std::size_t) {
        if (done) return;
        if (differ) return finish(streams_differ(peer, a->in.streams));  // told the peer first
        boost::system::error_code ignore2;
        if (ec3) {  // the peer retries
          a->sock.close(ignore2);
          return;
        }
        if (connected(peer, conn))
          return finish(std::make_exception_ptr(
              IOError(k_op, "two connections claim to be rank " + std::to_string(peer), rank)));
        established(peer, conn, std::move(a->sock));
      });
    });
  };
  std::function<void()> do_accept = [&]() {
    acceptor.async_accept([&](const boost::system::error_code& ec, tcp::socket s) {
      if (done) return;
      if (ec) {
        if (ec == asio::error::operation_aborted) return;
        return do_accept();
      }
      auto a = std::make_shared<Accepted>(std::move(s));
      accepting.push_back(a);
      do_accept();
      a->hs = std::make_unique<net::ServerHandshake>(net::Purpose::data, creds, net::Admit{});
      a->buf.assign(net::kMagicSize, '\0');
      asio::async_read(a->sock, asio::buffer(a->buf), [&, a](const boost::system::error_code& e1, std::size_t) {
        if (done) return;
        if (e1) return drop(a, "");
        if (!net::ServerHandshake::magic_ok(a->buf)) return drop(a, "not a dopt handshake");
        a->rest.assign(net::kHelloSize - net::kMagicSize, '\0');
        asio::async_read(a->sock, asio::buffer(a->rest), [&, a](const boost::system::error_code& e2, std::size_t) {
          if (done) return;
          if (e2) return drop(a, "");
          a->reply = a->hs->on_hello(a->buf + a->rest);
          asio::async_write(a->sock, asio::buffer(a->reply), [&, a](const boost::system::error_code& e3, std::size_t) {
            if (done) return;
            if (e3 || a->hs->refused()) return drop(a, a->hs->refused() ? a->hs->refusal() : "");
            a->buf.assign(net::kProofSize, '\0');
            asio::async_read(a->sock, asio::buffer(a->buf), [&, a](const boost::system::error_code& e4, std::size_t) {
              if (done) return;
              if (e4) return drop(a, "");
              a->verdict = a->hs->on_proof(a->buf);
              asio::async_write(a->sock, asio::buffer(a->verdict), [&, a](const boost::system::error_code& e5,
                                                                          std::size_t) {
                if (done) return;
                if (e5 || !a->hs->admitted()) return drop(a, a->hs->admitted() ? "" : a->hs->refusal());
                read_hello(a);
              });
            });
          });
        });
      });
    });
  };

  deadline.expires_after(timeout);
  deadline.async_wait([&](const boost::system::error_code& ec) {
    if (ec || done) return;
    std::string missing;
    for (int j = 0; j < world; ++j) {
      if (j == rank || fully_connected(j)) continue;
      if (!missing.empty()) missing += "; ";
      if (j > rank)
        missing += "rank " + std::to_string(j) + " at " + endpoints[j] + " (" +
                   (last_error[j].empty() ? std::string("no answer") : last_error[j]) + ")";
      else
        missing += "rank " + std::to_string(j) + " did not connect to port " +
                   std::to_string(lis->port);
    }
    finish(std::make_exception_ptr(TimeoutError(
        k_op, "not connected within " + std::to_string(timeout.count()) + " ms to " + missing, rank)));
  });

  if (rank > 0) do_accept();
  for (auto& c : conns) try_connect(c.get());
  io.run();
  io.restart();
  boost::system::error_code ignore;
  acceptor.close(ignore);
  if (fatal) {
    for (auto& p : peers) {
      if (p->sock) p->sock->close(ignore);
      for (auto& c : p->data)
        if (c->sock) c->sock->close(ignore);
    }
    std::rethrow_exception(fatal);
  }
  // Data connection k moves to lane k's io_context (its thread serves it).
  for (auto& p : peers)
    for (int k = 0; k < streams; ++k) {
      auto& s = p->data[std::size_t(k)]->sock;
      if (!s) continue;
      const auto protocol = s->local_endpoint().protocol();
      const auto fd = s->release();
      s = std::make_unique<tcp::socket>(lanes[std::size_t(k)]->io, protocol, fd);
    }
}

// ---- public --------------------------------------------------------------------

TcpMesh::TcpMesh(int rank, int world_size, TcpListener&& listener,
                 const std::vector<std::string>& endpoints, std::chrono::milliseconds timeout,
                 TcpMeshOptions options) {
  if (world_size < 1)
    throw ValueError(k_op, "world size must be at least 1, got " + std::to_string(world_size));
  if (rank < 0 || rank >= world_size)
    throw ValueError(k_op, "rank " + std::to_string(rank) + " is outside a world of " +
                               std::to_string(world_size));
  if (static_cast<int>(endpoints.size()) != world_size)
    throw ValueError(k_op, "got " + std::to_string(endpoints.size()) + " endpoints for a world of " +
                               std::to_string(world_size), rank);
  if (!listener.valid()) throw ValueError(k_op, "the listener is not valid (moved from?)", rank);
  if (options.streams < 0) options.streams = int(env_setting("DOPT_TCP_STREAMS", 0, k_max_streams, k_default_streams));
  if (options.streams > k_max_streams)
    throw ValueError(k_op, "streams must be at most " + std::to_string(k_max_streams) + ", got " +
                               std::to_string(options.streams), rank);
  if (options.stripe_min_bytes == 0)
    options.stripe_min_bytes =
        std::size_t(env_setting("DOPT_TCP_STRIPE_MIN", 1, 1LL << 40, (long long)k_default_stripe_min));
  if (options.socket_buffer_bytes == 0)
    options.socket_buffer_bytes = std::size_t(env_setting("DOPT_TCP_SOCKET_BUFFER", 0, 1LL << 30, 0));
  impl_ = std::make_shared<Impl>(std::move(listener.impl_), rank, world_size, std::move(options));
  impl_->establish(endpoints, timeout);
  impl_->start_threads();
}

TcpMesh::~TcpMesh() {
  if (impl_) impl_->close();
}

int TcpMesh::rank() const noexcept { return impl_->rank; }
int TcpMesh::world_size() const noexcept { return impl_->world; }
int TcpMesh::streams() const noexcept { return impl_->streams; }

void TcpMesh::send(int peer, Tag tag, const void* data, std::size_t n, Completion done,
                   std::uint32_t aux) {
  impl_->check_peer(peer, "send");
  if (!done) throw ValueError("tcp mesh send", "no completion callback", impl_->rank);
  Impl* im = impl_.get();
  im->submit([im, peer, op = Impl::SendOp{tag, data, n, std::move(done), aux}]() mutable {
    im->do_send(peer, std::move(op));
  });
}

void TcpMesh::recv(int peer, Tag tag, void* data, std::size_t n, Completion done,
                   std::uint32_t* aux_out) {
  impl_->check_peer(peer, "recv");
  if (!done) throw ValueError("tcp mesh recv", "no completion callback", impl_->rank);
  Impl* im = impl_.get();
  im->submit([im, peer, tag, op = Impl::RecvOp{data, n, std::move(done), aux_out}]() mutable {
    im->do_recv(peer, tag, std::move(op));
  });
}

void TcpMesh::post(std::function<void()> fn) {
  Impl* im = impl_.get();
  if (im->in_io_thread()) return asio::post(im->io, std::move(fn));
  im->submit(std::move(fn));
}

bool TcpMesh::in_io_thread() const noexcept { return impl_->in_io_thread(); }

void TcpMesh::fail_peer(int peer, const std::string& why) {
  impl_->check_peer(peer, "fail_peer");
  Impl* im = impl_.get();
  try {
    im->submit([im, peer, why] { im->lose(*im->peers[peer], why); });
  } catch (const StateError&) {
    // closed: nothing left to fail
  }
}

bool TcpMesh::peer_lost(int peer) const {
  impl_->check_peer(peer, "peer_lost");
  return impl_->peers[peer]->lost_flag.load();
}

void TcpMesh::close() { impl_->close(); }

}  // namespace dopt::transport
