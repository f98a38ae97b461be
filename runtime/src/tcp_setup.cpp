// TcpMesh's setup: the listener, and establish(): every connection of this
// rank (control and data, to and from every peer), dopt's handshake on each,
// then the hello that names its rank and connection index.
#include <cerrno>
#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dopt/runtime/notice.hpp"
#include "tcp_mesh_impl.hpp"

namespace dopt::transport {

using namespace tcp_detail;

namespace {

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

TcpListener::TcpListener() = default;
TcpListener::TcpListener(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TcpListener::TcpListener(TcpListener&&) noexcept = default;
TcpListener& TcpListener::operator=(TcpListener&&) noexcept = default;
TcpListener::~TcpListener() = default;
std::uint16_t TcpListener::port() const { return impl_ ? impl_->port : 0; }

TcpListener TcpMesh::listen(const std::string& bind_host) { return listen(bind_host, 0, 0); }

TcpListener TcpMesh::listen(const std::string& bind_host, int port_lo, int port_hi) {
  std::unique_ptr<TcpListener::Impl> impl;
  try {
    impl = std::make_unique<TcpListener::Impl>();  // an event loop (epoll): a descriptor of its own
  } catch (const boost::system::system_error& e) {
    throw IOError(k_op, "cannot listen on \"" + bind_host + "\": " + errno_text(e.code().value()));
  }
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
      if (ec) { last = errno_text(ec.value()); continue; }
      a.set_option(asio::socket_base::reuse_address(true), ec);
      a.bind(ep, ec);
      if (!ec) a.listen(asio::socket_base::max_listen_connections, ec);
      if (ec) {
        last = errno_text(ec.value());
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
  // A replacement's mesh (accept_from) connects to nobody: its members connect to it.
  const bool replacement = !opts.accept_from.empty();
  auto vacant = [&](int j) { return std::find(opts.absent.begin(), opts.absent.end(), j) != opts.absent.end(); };
  int present = world;
  for (int j = 0; j < world; ++j) present -= vacant(j) && j != rank ? 1 : 0;
  std::vector<std::unique_ptr<Conn>> conns;
  for (int j = rank + 1; j < world && !replacement; ++j) {
    if (vacant(j)) continue;
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

  const int expected = (replacement ? int(opts.accept_from.size()) : present - 1) * (streams + 1);
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
      const bool ours = replacement ? peer != rank && accepts(peer) : peer < rank && !vacant(peer);
      if (a->in.version != k_version || a->in.world != world || peer < 0 || peer >= world || !ours ||
          (a->in.streams == streams && (conn < 0 || conn > streams))) {
        return finish(std::make_exception_ptr(IOError(
            k_op,
            "a peer connected as rank " + std::to_string(peer) + " of a world of " +
                std::to_string(a->in.world) + " (protocol " + std::to_string(a->in.version) +
                "); expected " + (replacement ? "a member" : "a rank below " + std::to_string(rank)) +
                " of " + std::to_string(world),
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
        // Out of descriptors or memory: no retry cures it; named here, on
        // the rank that hit it (its peers then see this rank gone).
        if (ec == asio::error::no_descriptors || ec.value() == ENFILE || ec == asio::error::no_memory ||
            ec == asio::error::no_buffer_space)
          return finish(std::make_exception_ptr(
              IOError(k_op, "cannot accept the connections of the data plane: " + errno_text(ec.value()), rank)));
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
      if (j == rank || fully_connected(j) || (replacement && !accepts(j)) || vacant(j)) continue;
      if (!missing.empty()) missing += "; ";
      if (j > rank && !replacement)
        missing += "rank " + std::to_string(j) + " at " + endpoints[j] + " (" +
                   (last_error[j].empty() ? std::string("no answer") : last_error[j]) + ")";
      else
        missing += "rank " + std::to_string(j) + " did not connect to port " +
                   std::to_string(lis->port);
    }
    finish(std::make_exception_ptr(TimeoutError(
        k_op, "not connected within " + std::to_string(timeout.count()) + " ms to " + missing, rank)));
  });

  if (expected == 0) finish(nullptr);  // every other slot is vacant
  else if (rank > 0 || replacement) do_accept();
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
  // A replacement's peers that are not members were lost before it came;
  // vacant slots are lost from the start.
  for (auto& p : peers)
    if (p->rank != rank && vacant(p->rank)) {
      p->lost = std::make_exception_ptr(PeerLostError(
          k_op, "rank " + std::to_string(p->rank) + "'s slot is vacant: the job started without it", rank));
      p->lost_flag = true;
    } else if (replacement && p->rank != rank && !accepts(p->rank)) {
      p->lost = std::make_exception_ptr(PeerLostError(
          k_op, "rank " + std::to_string(p->rank) + " was lost before rank " + std::to_string(rank) + "'s replacement joined",
          rank));
      p->lost_flag = true;
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

}  // namespace dopt::transport
