// CAF's BASP connections behind a framing check (basp_guard.hpp).
#include "core/basp_guard.hpp"

#include <atomic>
#include <cstring>
#include <utility>

#include "caf/io/middleman.hpp"
#include "caf/io/network/default_multiplexer.hpp"
#include "caf/io/network/native_socket.hpp"
#include "caf/io/network/stream_impl.hpp"
#include "caf/policy/tcp.hpp"
#include "dopt/runtime/notice.hpp"

namespace dopt::detail {

namespace {

namespace net = caf::io::network;

std::atomic<int> g_notes{0};
constexpr int kMaxNotes = 5;

std::string peer_of(net::native_socket fd) {
  auto addr = net::remote_addr_of_fd(fd);
  auto port = net::remote_port_of_fd(fd);
  if (!addr || !port) return "an unknown address";
  return *addr + ":" + std::to_string(*port);
}

/// policy::tcp with the framing check on every read.
struct GuardPolicy {
  BaspFrameCheck check;
  std::string what;

  GuardPolicy(BaspFrameCheck::Side side, std::uint32_t max_payload, std::string w)
      : check(side, max_payload), what(std::move(w)) {}

  net::rw_state read_some(std::size_t& result, net::native_socket fd, void* buf, std::size_t len) {
    const net::rw_state st = caf::policy::tcp::read_some(result, fd, buf, len);
    if (st != net::rw_state::success || result == 0) return st;
    const std::string& bad = check.feed(buf, result);
    if (bad.empty()) return st;
    const int n = g_notes.fetch_add(1);
    if (n < kMaxNotes)
      notice("closed the connection from " + peer_of(fd) + " to " + what + ": it sent " + bad +
             " (not a dopt rank, or a damaged connection); the job goes on");
    else if (n == kMaxNotes)
      notice("further connections closed for breaking CAF's protocol are not reported");
    result = 0;
    return net::rw_state::failure;
  }

  static net::rw_state write_some(std::size_t& result, net::native_socket fd, const void* buf, std::size_t len) {
    return caf::policy::tcp::write_some(result, fd, buf, len);
  }

  static bool must_read_more(net::native_socket, std::size_t) { return false; }
};

/// CAF's default scribe (network::scribe_impl) with GuardPolicy in place of
/// policy::tcp.
class GuardedScribe final : public caf::io::scribe {
 public:
  GuardedScribe(net::default_multiplexer& mx, net::native_socket fd, GuardPolicy policy)
      : caf::io::scribe(net::conn_hdl_from_socket(fd)), stream_(mx, fd, std::move(policy)) {}

  void configure_read(caf::io::receive_policy::config config) override {
    stream_.configure_read(config);
    if (!launched_) {  // the first configure_read starts the read loop
      launched_ = true;
      stream_.start(this);
    }
  }
  void ack_writes(bool enable) override { stream_.ack_writes(enable); }
  std::vector<char>& wr_buf() override { return stream_.wr_buf(); }
  std::vector<char>& rd_buf() override { return stream_.rd_buf(); }
  void graceful_shutdown() override {
    stream_.graceful_shutdown();
    detach(&stream_.backend(), false);
  }
  void flush() override { stream_.flush(this); }
  std::string addr() const override {
    auto x = net::remote_addr_of_fd(stream_.fd());
    return x ? *x : std::string();
  }
  std::uint16_t port() const override {
    auto x = net::remote_port_of_fd(stream_.fd());
    return x ? *x : 0;
  }
  void add_to_loop() override { stream_.activate(this); }
  void remove_from_loop() override { stream_.passivate(); }

 private:
  bool launched_ = false;
  net::stream_impl<GuardPolicy> stream_;
};

}  // namespace

caf::io::scribe_ptr guarded_scribe(caf::actor_system& sys, int fd, BaspFrameCheck::Side side,
                                   std::uint32_t max_payload, std::string what) {
  auto& mx = static_cast<net::default_multiplexer&>(sys.middleman().backend());
  return caf::make_counted<GuardedScribe>(mx, fd, GuardPolicy(side, max_payload, std::move(what)));
}

}  // namespace dopt::detail
