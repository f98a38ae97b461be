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

void TcpMesh::Impl::lane_send(DataConn& c, Piece pc) {
  if (c.dead) return post_done(std::move(pc.done), c.dead_why);
  c.wq.push_back(std::move(pc));
  if (!c.writing) lane_write(c);
}

void TcpMesh::Impl::lane_write(DataConn& c) {
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

void TcpMesh::Impl::lane_expect(DataConn& c, Piece pc) {
  if (c.dead) return post_done(std::move(pc.done), c.dead_why);
  c.rq.push_back(std::move(pc));
  if (!c.reading) lane_read(c);
}

void TcpMesh::Impl::lane_read(DataConn& c) {
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
    else
      why = piece_problem(c.rhdr, done.hdr.seq, done.n);
    if (!why.empty() || c.dead) {
      lane_kill(c, why.empty() ? "closed" : why);
      return post_done(std::move(done.done), c.dead_why);
    }
    post_done(std::move(done.done), "");
    if (!c.rq.empty()) lane_read(c);
  });
}

}  // namespace dopt::transport
