// dopt's listening side of the handshake (handshake.hpp, AuthListener): an
// Asio thread that accepts, runs the server side of the handshake on every
// connection at once (each bounded by the handshake timeout), hands the ones
// that pass to on_ready, makes room when too many stall and sheds
// connections while the process is out of descriptors.
#include "dopt/runtime/internal/handshake.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include <boost/asio.hpp>

#include "dopt/runtime/error.hpp"
#include "dopt/runtime/notice.hpp"

namespace dopt::net {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

struct AuthListener::Impl : std::enable_shared_from_this<AuthListener::Impl> {
  Options opts;
  asio::io_context io{1};
  tcp::acceptor acceptor{io};
  std::uint16_t port = 0;
  std::thread thread;
  std::mutex close_mutex;
  bool closed = false;
  int pending = 0;  // handshakes in progress (I/O thread only)
  int notes = 0;    // refusals reported (I/O thread only)

  static constexpr int kMaxPending = 64;
  static constexpr int kMaxNotes = 5;

  struct Conn {
    tcp::socket sock;
    asio::steady_timer timer;
    ServerHandshake hs;
    std::string buf;
    std::string from;
    bool hello_done = false;  // its whole hello arrived
    bool proof_done = false;  // its proof arrived (a verdict is being written)
    bool dropped = false;     // closed (drop() ran)
    Conn(tcp::socket s, const Options& o)
        : sock(std::move(s)), timer(sock.get_executor()), hs(o.purpose, o.credentials, o.admit) {}
  };
  std::vector<std::weak_ptr<Conn>> live;  // for close() (I/O thread only)

  // A descriptor kept free for shed() (a process out of descriptors can still
  // tell a connecting rank why it refuses it).
  int spare_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  bool shed_noted = false;
  asio::steady_timer pause_timer{io};

  explicit Impl(Options o) : opts(std::move(o)) {}
  ~Impl() {
    if (spare_fd >= 0) ::close(spare_fd);
  }

  void note(const std::string& from, const std::string& why) {
    if (notes > kMaxNotes) return;
    if (notes++ == kMaxNotes) {
      notice("further refused connections to " + opts.what + " are not reported");
      return;
    }
    notice("refused a connection from " + from + " to " + opts.what + ": " + why);
  }

  void accept() {
    auto self = shared_from_this();
    acceptor.async_accept([self](const boost::system::error_code& ec, tcp::socket s) {
      if (ec == asio::error::operation_aborted || !self->acceptor.is_open()) return;
      if (!ec) self->start(std::move(s));
      if (ec == asio::error::no_descriptors || ec.value() == ENFILE || ec == asio::error::no_memory ||
          ec == asio::error::no_buffer_space)
        return self->shed(ec.value());
      self->accept();
    });
  }

  /// This process is out of descriptors (or memory): the connection waiting
  /// in the backlog is taken with the spare descriptor and told why, so that
  /// the connecting rank names this one instead of waiting out its handshake
  /// timeout; then accepting pauses for 100 ms (no busy loop). Noted once.
  void shed(int err) {
    if (!shed_noted) {
      shed_noted = true;
      notice(opts.what + " cannot accept connections: " + errno_text(err) +
             "; connecting processes are told so and refused until this process has descriptors again");
    }
    if (spare_fd >= 0) {
      ::close(spare_fd);
      spare_fd = -1;
      const int fd = ::accept4(acceptor.native_handle(), nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) {
        const std::string reply =
            ServerHandshake::refusal_reply("the process of " + owner() + " cannot take connections: " + errno_text(err));
        (void)::send(fd, reply.data(), reply.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        ::shutdown(fd, SHUT_WR);
        // Read what the client sent (its hello), so that closing sends no
        // reset that could discard the refusal before the client reads it.
        char sink[kHelloSize];
        pollfd pf{fd, POLLIN, 0};
        for (int k = 0; k < 4 && ::poll(&pf, 1, 50) > 0; ++k)
          if (::recv(fd, sink, sizeof sink, MSG_DONTWAIT) <= 0) break;
        ::close(fd);
      }
      spare_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    }
    auto self = shared_from_this();
    pause_timer.expires_after(std::chrono::milliseconds(100));
    pause_timer.async_wait([self](const boost::system::error_code& e) {
      if (!e && self->acceptor.is_open()) self->accept();
    });
  }

  /// "rank 0" for "rank 0's rendezvous port" (the process this listener is of).
  std::string owner() const {
    const auto at = opts.what.find("'s ");
    return at == std::string::npos ? opts.what : opts.what.substr(0, at);
  }

  /// At kMaxPending handshakes in progress, a newcomer takes the place of
  /// the oldest connection whose hello has not arrived (a process that
  /// opens connections and sends nothing, or a byte at a time, cannot keep
  /// the ranks out), else of the oldest whose proof has not arrived (a
  /// process that knows a job id but not the secret, or in a job without
  /// one sends its hello and stops). A rank's own handshake takes one round
  /// trip from hello to proof, so only a flood faster than that can displace
  /// it. When every pending one is past its proof, the newcomer is closed.
  bool make_room() {
    std::erase_if(live, [](const std::weak_ptr<Conn>& w) { return w.expired(); });
    if (pending < kMaxPending) return true;
    for (auto& w : live)  // oldest first
      if (auto c = w.lock(); c && !c->hello_done && !c->dropped) {
        drop(c, "it sent no complete handshake while " + std::to_string(kMaxPending) +
                    " connections were waiting (closed to make room)");
        return true;
      }
    for (auto& w : live)
      if (auto c = w.lock(); c && !c->proof_done && !c->dropped) {
        drop(c, "it sent its hello but no proof while " + std::to_string(kMaxPending) +
                    " connections were waiting (closed to make room)");
        return true;
      }
    return false;
  }

  void start(tcp::socket s) {
    boost::system::error_code ec;
    if (!make_room()) {
      s.close(ec);
      return;
    }
    auto c = std::make_shared<Conn>(std::move(s), opts);
    live.push_back(c);
    const auto ep = c->sock.remote_endpoint(ec);
    c->from = ec ? std::string("an unknown address") : ep.address().to_string() + ":" + std::to_string(ep.port());
    c->sock.set_option(tcp::no_delay(true), ec);
    ++pending;
    auto self = shared_from_this();
    c->timer.expires_after(opts.handshake_timeout);
    c->timer.async_wait([c](const boost::system::error_code& e) {
      boost::system::error_code ignore;
      if (!e) c->sock.close(ignore);  // too slow: whatever is pending fails
    });
    c->buf.assign(kMagicSize, '\0');
    asio::async_read(c->sock, asio::buffer(c->buf), [self, c](const boost::system::error_code& e, std::size_t got) {
      // Closed before a byte (a port scan, a health check): nothing to report.
      if (e && got == 0) return self->drop(c, "");
      if (e == asio::error::eof)
        return self->drop(c, "not a dopt handshake (" + std::to_string(got) + " bytes, then it closed the connection)");
      if (e)
        return self->drop(c, "it sent " + std::to_string(got) + " bytes and then nothing within " +
                                 std::to_string(self->opts.handshake_timeout.count()) +
                                 " ms (DOPT_HANDSHAKE_TIMEOUT_MS)");
      if (!ServerHandshake::magic_ok(c->buf)) return self->drop(c, "not a dopt handshake");
      auto rest = std::make_shared<std::string>(kHelloSize - kMagicSize, '\0');
      asio::async_read(c->sock, asio::buffer(*rest), [self, c, rest](const boost::system::error_code& e2, std::size_t) {
        if (e2) return self->drop(c, "the hello did not arrive in time");
        c->hello_done = true;
        auto reply = std::make_shared<std::string>(c->hs.on_hello(c->buf + *rest));
        asio::async_write(c->sock, asio::buffer(*reply), [self, c, reply](const boost::system::error_code& e3,
                                                                          std::size_t) {
          if (e3 || c->hs.refused()) return self->drop(c, c->hs.refused() ? c->hs.refusal() : "");
          c->buf.assign(kProofSize, '\0');
          asio::async_read(c->sock, asio::buffer(c->buf), [self, c](const boost::system::error_code& e4, std::size_t) {
            if (!e4) c->proof_done = true;
            if (e4 == asio::error::eof)
              return self->drop(c, "the connecting process left during the handshake (it did not accept this side's "
                                   "proof: another job's secret?)");
            if (e4) return self->drop(c, "the proof did not arrive in time");
            auto verdict = std::make_shared<std::string>(c->hs.on_proof(c->buf));
            asio::async_write(c->sock, asio::buffer(*verdict), [self, c, verdict](const boost::system::error_code& e5,
                                                                                  std::size_t) {
              if (e5 || !c->hs.admitted()) return self->drop(c, c->hs.admitted() ? "" : c->hs.refusal());
              self->ready(c);
            });
          });
        });
      });
    });
  }

  void drop(const std::shared_ptr<Conn>& c, const std::string& why) {
    if (c->dropped) return;  // closed to make room; its handler ran later
    c->dropped = true;
    --pending;
    boost::system::error_code ignore;
    c->timer.cancel();
    c->sock.close(ignore);
    if (!why.empty()) note(c->from, why);
  }

  void ready(const std::shared_ptr<Conn>& c) {
    if (c->dropped) return;
    c->dropped = true;
    --pending;
    c->timer.cancel();
    boost::system::error_code ec;
    const int fd = c->sock.release(ec);
    if (ec) return;
    try {
      opts.on_ready(fd, c->hs.peer());
    } catch (...) {
      // on_ready owns fd from the call on; it must not throw, but a listener
      // thread must not die of it either.
    }
  }
};

namespace {
/// The listener's state; its event loop (epoll) needs descriptors of its own.
std::shared_ptr<AuthListener::Impl> make_listener_impl(AuthListener::Options options) {
  const std::string what = options.what;
  try {
    return std::make_shared<AuthListener::Impl>(std::move(options));
  } catch (const boost::system::system_error& e) {
    throw IOError("listen", what + " cannot start its event loop: " + errno_text(e.code().value()));
  }
}
}  // namespace

AuthListener::AuthListener(Options options) : impl_(make_listener_impl(std::move(options))) {
  Impl& im = *impl_;
  if (!im.opts.on_ready) throw ValueError("AuthListener", "on_ready is required");
  boost::system::error_code ec;
  tcp::resolver resolver(im.io);
  auto results = resolver.resolve(im.opts.bind_addr, "0", tcp::resolver::passive, ec);
  const std::string where = im.opts.bind_addr + ":" + std::to_string(im.opts.port);
  if (ec || results.empty())
    throw IOError("listen", "cannot resolve the bind address '" + im.opts.bind_addr + "': " + ec.message());
  std::string last;
  bool ok = false;
  const std::vector<int> ports = listen_ports(im.opts.port, im.opts.port_lo, im.opts.port_hi);
  for (int port : ports) {
    for (const auto& entry : results) {
      tcp::endpoint ep = entry.endpoint();
      ep.port(static_cast<std::uint16_t>(port));
      im.acceptor.open(ep.protocol(), ec);
      if (ec) {
        last = errno_text(ec.value());
        continue;
      }
      im.acceptor.set_option(asio::socket_base::reuse_address(true), ec);
      ::fcntl(im.acceptor.native_handle(), F_SETFD, FD_CLOEXEC);
      im.acceptor.bind(ep, ec);
      if (!ec) im.acceptor.listen(asio::socket_base::max_listen_connections, ec);
      if (ec) {
        last = errno_text(ec.value());
        boost::system::error_code ignore;
        im.acceptor.close(ignore);
        continue;
      }
      ok = true;
      break;
    }
    if (ok) break;
  }
  if (!ok && ports.size() > 1)
    throw IOError("listen", port_range_text(im.opts.port_lo, im.opts.port_hi) + " on " + im.opts.bind_addr +
                                " (every port is in use; last error: " + last + ")");
  if (!ok) throw IOError("listen", "cannot listen on " + where + ": " + last);
  im.port = im.acceptor.local_endpoint().port();
  im.accept();
  im.thread = std::thread([p = impl_] { p->io.run(); });
}

AuthListener::~AuthListener() { close(); }

std::uint16_t AuthListener::port() const noexcept { return impl_->port; }

void AuthListener::close() {
  std::lock_guard<std::mutex> lock(impl_->close_mutex);
  if (impl_->closed) return;
  impl_->closed = true;
  auto p = impl_;
  // Close everything on the I/O thread; run() returns once every pending
  // handler has finished (operation_aborted), which drops their references.
  asio::post(p->io, [p] {
    boost::system::error_code ignore;
    p->acceptor.close(ignore);
    p->pause_timer.cancel();
    for (auto& w : p->live)
      if (auto c = w.lock()) {
        c->timer.cancel();
        c->sock.close(ignore);
      }
  });
  if (p->thread.joinable()) {
    if (p->thread.get_id() == std::this_thread::get_id()) p->thread.detach();
    else p->thread.join();
  }
}

}  // namespace dopt::net
