// TcpMesh's data connections: the pieces of striped messages. Data connection
// k of every peer is served by lane k's thread; a piece's completion is
// posted back to the mesh's I/O thread.
#include <array>

#include "tcp_mesh_impl.hpp"

namespace dopt::transport {

using namespace tcp_detail;

// Closes p's data connections (on their lanes); their pieces in flight fail.
void TcpMesh::Impl::kill_data(Peer& p, const std::string& why) {
  for (int k = 0; k < streams; ++k) {
    DataConn* c = p.data[std::size_t(k)].get();
    asio::post(lanes[std::size_t(k)]->io, [this, c, why] { lane_kill(*c, why); });
  }
}

void TcpMesh::Impl::post_done(PieceDone done, std::string why) {
  asio::post(io, [done = std::move(done), why = std::move(why)] { done(why); });
}

// Closes c; fails its queued pieces (those in flight fail in their handlers).
void TcpMesh::Impl::lane_kill(DataConn& c, const std::string& why) {
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

namespace {

using Impl = TcpMesh::Impl;
using DataConn = Impl::DataConn;

// One direction of a data connection: its queue (the front piece is in
// flight while `busy`) and the member that starts the front piece.
struct Direction {
  std::deque<Impl::Piece> DataConn::*queue;
  bool DataConn::*busy;
  void (Impl::*start)(DataConn&);
};
constexpr Direction kWrite{&DataConn::wq, &DataConn::writing, &Impl::lane_write};
constexpr Direction kRead{&DataConn::rq, &DataConn::reading, &Impl::lane_read};

// Queues pc in direction d of c and starts it if d is idle; on a dead
// connection pc fails at once. Lane thread.
void enqueue(Impl& m, DataConn& c, Impl::Piece pc, const Direction& d) {
  if (c.dead) return m.post_done(std::move(pc.done), c.dead_why);
  (c.*d.queue).push_back(std::move(pc));
  if (!(c.*d.busy)) (m.*d.start)(c);
}

// The front piece of direction d has finished, failed with `why` (empty:
// no failure): a failure, or a connection killed meanwhile, kills c and
// fails the piece with c's reason; otherwise the piece completes and the
// next one starts. Lane thread (the piece's handler).
void finish_front(Impl& m, DataConn& c, const Direction& d, const std::string& why) {
  c.*d.busy = false;
  Impl::Piece done = std::move((c.*d.queue).front());
  (c.*d.queue).pop_front();
  if (!why.empty() || c.dead) {
    m.lane_kill(c, why.empty() ? "closed" : why);
    return m.post_done(std::move(done.done), c.dead_why);
  }
  m.post_done(std::move(done.done), "");
  if (!(c.*d.queue).empty()) (m.*d.start)(c);
}

}  // namespace

void TcpMesh::Impl::lane_send(DataConn& c, Piece pc) { enqueue(*this, c, std::move(pc), kWrite); }

void TcpMesh::Impl::lane_write(DataConn& c) {
  c.writing = true;
  Piece& pc = c.wq.front();
  const std::array<asio::const_buffer, 2> bufs{asio::buffer(&pc.hdr, sizeof(PieceHeader)),
                                               asio::const_buffer(pc.data, pc.n)};
  asio::async_write(*c.sock, bufs, [this, &c](const boost::system::error_code& ec, std::size_t) {
    finish_front(*this, c, kWrite, ec ? "write failed: " + describe(ec) : std::string());
  });
}

void TcpMesh::Impl::lane_expect(DataConn& c, Piece pc) { enqueue(*this, c, std::move(pc), kRead); }

void TcpMesh::Impl::lane_read(DataConn& c) {
  c.reading = true;
  Piece& pc = c.rq.front();
  const std::array<asio::mutable_buffer, 2> bufs{asio::buffer(&c.rhdr, sizeof(PieceHeader)),
                                                 asio::mutable_buffer(pc.data, pc.n)};
  asio::async_read(*c.sock, bufs, [this, &c](const boost::system::error_code& ec, std::size_t) {
    const Piece& front = c.rq.front();
    finish_front(*this, c, kRead, ec ? describe(ec) : piece_problem(c.rhdr, front.hdr.seq, front.n));
  });
}

}  // namespace dopt::transport
