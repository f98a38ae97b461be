// TcpMesh's control connections, on the mesh's I/O thread: sending (small
// messages whole, batched into one writev; the header of a striped message,
// whose pieces go to the lanes), reading headers, matching messages to posted
// recvs (or keeping them until one is posted) and completing recvs in the
// order of their tag's messages.
#include <cerrno>
#include <cstring>
#include <new>

#include "dopt/runtime/error.hpp"
#include "tcp_mesh_impl.hpp"

namespace dopt::transport {

using namespace tcp_detail;

namespace {

// Queued messages coalesced into one writev: at most this many, and small ones.
constexpr std::size_t k_max_batch = 32;
constexpr std::size_t k_batch_bytes = 256 * 1024;

}  // namespace

void TcpMesh::Impl::lose(Peer& p, const std::string& why) {
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

// Fails what is queued but not in flight (in-flight ops fail in their handlers).
void TcpMesh::Impl::fail_queued(Peer& p, const std::exception_ptr& e) {
  for (auto& op : p.sendq) deliver(std::move(op.done), e);
  p.sendq.clear();
  for (auto& [tag, q] : p.posted)
    for (auto& op : q) deliver(std::move(op.done), e);
  p.posted.clear();
}

// A part of a striped message is done (why: "" on success; a reason to
// give up on the peer, or "-" for a failure already accounted for).
void TcpMesh::Impl::part_done(Peer& p, const std::shared_ptr<Striped>& st, const std::string& why) {
  if (!why.empty()) {
    st->failed = true;
    if (why != "-") lose(p, why);
  }
  if (--st->left == 0) st->finish(st->failed);
}

void TcpMesh::Impl::do_send(int peer, SendOp op) {
  if (!rejoining.empty() && park(peer, [this, peer, op]() mutable { do_send(peer, std::move(op)); })) return;
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

void TcpMesh::Impl::start_write(Peer& p) {
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
Completion TcpMesh::Impl::ordered(Peer& p, Tag tag, Completion done) {
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

void TcpMesh::Impl::do_recv(int peer, Tag tag, RecvOp op) {
  if (!rejoining.empty() && park(peer, [this, peer, tag, op]() mutable { do_recv(peer, tag, std::move(op)); }))
    return;
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

void TcpMesh::Impl::finish_early(Peer& p, Tag tag, Early& msg, RecvOp op) {
  if (msg.n != op.n) return deliver(std::move(op.done), mismatch(p, tag, msg.n, op.n));
  if (msg.n > 0) std::memcpy(op.data, msg.data.get(), msg.n);
  msg.data = BufferPool::Lease();  // back to the pool for the next early message
  if (op.aux_out) *op.aux_out = msg.aux;
  deliver(std::move(op.done), nullptr);
}

// An early message that failed to arrive: it leaves the queue (when still
// there) and fails the recv that waits for it.
void TcpMesh::Impl::drop_early(Peer& p, Tag tag, const std::shared_ptr<Early>& msg) {
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

std::exception_ptr TcpMesh::Impl::mismatch(const Peer& p, Tag tag, std::size_t got, std::size_t want) const {
  return std::make_exception_ptr(CollectiveMismatchError(
      k_op,
      "message from rank " + std::to_string(p.rank) + " (tag " + std::to_string(tag.hi) + "/" +
          std::to_string(tag.lo) + ") has " + std::to_string(got) +
          " bytes, the matching recv expects " + std::to_string(want),
      rank));
}

void TcpMesh::Impl::read_header(Peer& p) {
  asio::async_read(*p.sock, asio::buffer(&p.rhdr, sizeof(Header)),
                   [this, &p](const boost::system::error_code& ec, std::size_t) {
                     if (closing_ || p.lost) return;
                     if (ec) return lose(p, describe(ec));
                     if (std::string why = header_problem(p.rhdr, streams, p.recv_seq); !why.empty())
                       return lose(p, why);
                     if (p.rhdr.pieces > 0) return on_striped_header(p);
                     on_header(p);
                   });
}

std::optional<TcpMesh::Impl::RecvOp> TcpMesh::Impl::take_posted(Peer& p, Tag tag) {
  auto it = p.posted.find(tag);
  if (it == p.posted.end()) return std::nullopt;
  RecvOp op = std::move(it->second.front());
  it->second.pop_front();
  if (it->second.empty()) p.posted.erase(it);
  op.done = ordered(p, tag, std::move(op.done));
  return op;
}

void TcpMesh::Impl::on_header(Peer& p) {
  const Tag tag{p.rhdr.hi, p.rhdr.lo};
  const std::size_t len = p.rhdr.len;
  if (auto posted = take_posted(p, tag)) {
    RecvOp& op = *posted;
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
void TcpMesh::Impl::on_striped_header(Peer& p) {
  const Tag tag{p.rhdr.hi, p.rhdr.lo};
  const std::size_t len = p.rhdr.len;
  const std::uint32_t pieces = p.rhdr.pieces, seq = p.rhdr.seq;  // checked by header_problem
  ++p.recv_seq;
  auto st = std::make_shared<Striped>();
  st->left = int(pieces);
  std::byte* dest = nullptr;
  if (auto posted = take_posted(p, tag)) {
    RecvOp& op = *posted;
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
    msg->data = pool.take(len);
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

void TcpMesh::Impl::read_early(Peer& p, Tag tag, std::size_t len, bool queue) {
  auto msg = std::make_shared<Early>();
  msg->n = len;
  msg->aux = p.rhdr.aux;
  if (len > 0) {
    try {
      msg->data = pool.take(len);
    } catch (const std::bad_alloc&) {
      // Named here, on the rank that ran out; the peer sees the connection end.
      return lose(p, "cannot hold a message of " + std::to_string(len) +
                         " bytes that came before its recv: " + errno_text(ENOMEM));
    }
  }
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

}  // namespace dopt::transport
