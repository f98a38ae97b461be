// TcpMesh::reconnect_peer(): a member's connections to the replacement of a
// lost rank (made on a thread of their own, with the setup's handshake and
// hello), and their installation in place of the lost peer's on the I/O
// thread. The replacement's side is establish() with accept_from
// (tcp_setup.cpp).
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "dopt/runtime/notice.hpp"
#include "tcp_mesh_impl.hpp"

namespace dopt::transport {

using namespace tcp_detail;

namespace {

using Clock = std::chrono::steady_clock;

// One asynchronous step on io, run until it completes, the deadline passes
// or the mesh closes (then the socket is closed and timed_out returned).
template <class Start>
boost::system::error_code step(asio::io_context& io, tcp::socket& s, Clock::time_point until,
                               const std::atomic<bool>& stop, Start start) {
  boost::system::error_code result = asio::error::timed_out;
  bool finished = false;
  start([&](const boost::system::error_code& ec, auto&&...) {
    result = ec;
    finished = true;
  });
  while (!finished && !stop && Clock::now() < until) {
    io.restart();
    io.run_for(std::chrono::milliseconds(50));
  }
  if (!finished) {
    boost::system::error_code ignore;
    s.close(ignore);
    io.restart();
    io.run();  // the aborted handler
    return asio::error::timed_out;
  }
  return result;
}

}  // namespace

void TcpMesh::Impl::reconnect(int peer, const std::string& endpoint, std::chrono::milliseconds timeout) {
  const auto until = Clock::now() + timeout;
  const std::string who = "rank " + std::to_string(peer) + "'s replacement at " + endpoint;
  asio::io_context own{1};
  std::unique_ptr<tcp::socket> ctl;
  std::vector<std::unique_ptr<tcp::socket>> data;
  std::string why;
  try {
    const auto colon = endpoint.rfind(':');
    if (colon == std::string::npos) throw IOError(k_op, "endpoint \"" + endpoint + "\" is not host:port", rank);
    std::string host = endpoint.substr(0, colon);
    if (host.size() >= 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
    boost::system::error_code ec;
    tcp::resolver resolver(own);
    const auto addrs = resolver.resolve(host, endpoint.substr(colon + 1), tcp::resolver::numeric_service, ec);
    if (ec) throw IOError(k_op, "cannot resolve " + who + ": " + ec.message(), rank);
    net::Credentials creds = opts.credentials;
    creds.rank = rank;
    creds.world_size = world;
    for (int k = 0; k <= streams && why.empty(); ++k) {
      auto s = std::make_unique<tcp::socket>(k == 0 ? io : lanes[std::size_t(k - 1)]->io);
      tcp::socket sock(own);
      auto fail = [&](const std::string& what, const boost::system::error_code& e) {
        why = what + ": " + describe(e);
      };
      if ((ec = step(own, sock, until, stop_rejoin, [&](auto h) { asio::async_connect(sock, addrs, h); }))) {
        fail("cannot connect", ec);
        break;
      }
      set_socket_options(sock, k);
      net::ClientHandshake hs(net::Purpose::data, creds, who, k_op);
      std::string reply(net::kReplySize, '\0'), verdict(net::kVerdictSize, '\0'), proof;
      auto io_step = [&](auto op) { return step(own, sock, until, stop_rejoin, op); };
      if ((ec = io_step([&](auto h) { asio::async_write(sock, asio::buffer(hs.hello()), h); })) ||
          (ec = io_step([&](auto h) { asio::async_read(sock, asio::buffer(reply), h); }))) {
        fail("no handshake", ec);
        break;
      }
      proof = hs.on_reply(reply);
      if ((ec = io_step([&](auto h) { asio::async_write(sock, asio::buffer(proof), h); })) ||
          (ec = io_step([&](auto h) { asio::async_read(sock, asio::buffer(verdict), h); }))) {
        fail("no handshake verdict", ec);
        break;
      }
      hs.on_verdict(verdict);
      Hello out{k_hello_magic, k_version, rank, world, k, streams}, in{};
      if ((ec = io_step([&](auto h) { asio::async_write(sock, asio::buffer(&out, sizeof out), h); })) ||
          (ec = io_step([&](auto h) { asio::async_read(sock, asio::buffer(&in, sizeof in), h); }))) {
        fail("no hello", ec);
        break;
      }
      if (in.magic != k_hello_magic || in.version != k_version || in.rank != peer || in.world != world ||
          in.conn != k || in.streams != streams) {
        why = "it answered as rank " + std::to_string(in.rank) + " of " + std::to_string(in.world) + " with " +
              std::to_string(in.streams) + " data connections (expected rank " + std::to_string(peer) + " of " +
              std::to_string(world) + " with " + std::to_string(streams) + ")";
        break;
      }
      const auto protocol = sock.local_endpoint().protocol();
      s->assign(protocol, sock.release());
      (k == 0 ? ctl : data.emplace_back()) = std::move(s);
    }
  } catch (const std::exception& e) {
    why = e.what();
  }
  if (!why.empty()) {
    ctl.reset();
    data.clear();
    if (!stop_rejoin) notice("rank " + std::to_string(rank) + " could not connect its TCP mesh to " + who + ": " + why);
  }
  try {
    submit([this, peer, c = std::shared_ptr<tcp::socket>(ctl.release()),
            d = std::make_shared<std::vector<std::unique_ptr<tcp::socket>>>(std::move(data))]() mutable {
      install(peer, c ? std::make_unique<tcp::socket>(std::move(*c)) : nullptr, std::move(*d));
    });
  } catch (const StateError&) {
    // closed meanwhile: the sockets close with this frame
  }
}

void TcpMesh::Impl::install(int peer, std::unique_ptr<tcp::socket> ctl, std::vector<std::unique_ptr<tcp::socket>> data) {
  if (ctl && !closing_ && int(data.size()) == streams) {
    lose(*peers[peer], "rank " + std::to_string(peer) + " was replaced by a new process");
    auto fresh = std::make_unique<Peer>();
    fresh->rank = peer;
    fresh->sock = std::move(ctl);
    for (auto& s : data) {
      fresh->data.push_back(std::make_unique<DataConn>());
      fresh->data.back()->sock = std::move(s);
    }
    {
      std::lock_guard<std::mutex> lock(peers_m);
      retired.push_back(std::exchange(peers[std::size_t(peer)], std::move(fresh)));
    }
    read_header(*peers[std::size_t(peer)]);
  }
  rejoin_done(peer);
}

void TcpMesh::Impl::rejoin_done(int peer) {
  auto it = rejoining.find(peer);
  if (it == rejoining.end()) return;
  auto waited = std::move(it->second);
  rejoining.erase(it);
  for (auto& op : waited) op();
}

void TcpMesh::reconnect_peer(int peer, const std::string& endpoint, std::chrono::milliseconds timeout) {
  impl_->check_peer(peer, "reconnect_peer");
  Impl* im = impl_.get();
  // Marked first: what this thread requests after this call waits for it.
  im->submit([im, peer] { im->rejoining[peer]; });
  std::lock_guard<std::mutex> lock(im->rejoin_m);
  if (im->stop_rejoin) return;  // closing: its operations fail with the mesh's
  im->rejoin_threads.emplace_back([im, peer, endpoint, timeout] { im->reconnect(peer, endpoint, timeout); });
}

}  // namespace dopt::transport
