// TcpMesh: its lifetime (the I/O thread and the lane threads, close()) and
// its public functions. The rest of the mesh: tcp_mesh_impl.hpp names the files.
#include "dopt/runtime/internal/tcp_transport.hpp"

#include <future>

#include "dopt/runtime/internal/parallel.hpp"
#include "tcp_mesh_impl.hpp"
#include "tcp_settings.hpp"

namespace dopt::transport {

using namespace tcp_detail;

// ---- lifetime ------------------------------------------------------------------

TcpMesh::Impl::Impl(std::unique_ptr<TcpListener::Impl> l, int r, int w, TcpMeshOptions o)
    : lis(std::move(l)),
      pool(BufferPoolOptions{BufferPoolOptions{}.min_bytes, o.pool_bytes}),
      io(lis->io),
      rank(r),
      world(w),
      opts(std::move(o)),
      streams(opts.streams) {
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

TcpMesh::Impl::~Impl() {
  boost::system::error_code ec;
  for (auto& p : peers) {
    if (p->sock) p->sock->close(ec);
    for (auto& c : p->data)
      if (c->sock) c->sock->close(ec);
  }
}

void TcpMesh::Impl::shutdown_all() {
  closing_ = true;
  // What waited for a reconnection fails as the rest does.
  auto parked = std::exchange(rejoining, {});
  for (auto& [peer, ops] : parked)
    for (auto& op : ops) op();
  for (auto& pp : peers) {
    Peer& p = *pp;
    boost::system::error_code ec;
    if (p.sock) p.sock->close(ec);
    kill_data(p, "the mesh was closed");
    fail_queued(p, p.lost ? p.lost : closed_err);
  }
}

void TcpMesh::Impl::start_threads() {
  for (auto& l : lanes) {
    l->guard.emplace(asio::make_work_guard(l->io));
    l->thread = std::thread([lp = l.get()] { lp->io.run(); });
  }
  guard.emplace(asio::make_work_guard(io));
  for (int j = 0; j < world; ++j)
    if (j != rank && !peers[j]->lost) read_header(*peers[j]);
  thread = std::thread([this] { run_io(); });
}

// The I/O thread. With poll_us > 0 it keeps polling the sockets for that
// long after the last event before it sleeps in epoll: a message whose next
// bytes come within microseconds is served without a wake-up (the way
// OpenMPI's progress loop polls). While a caller drives (drive()) it stands
// aside: it hands over drive_token and waits until the caller is done.
void TcpMesh::Impl::run_io() {
  const auto spin = std::chrono::microseconds(std::max(0, opts.poll_us));
  auto last = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> token(drive_token);
  while (!io.stopped()) {
    if (drive_wanted.load(std::memory_order_acquire)) {
      // Stand aside while callers drive, and for k_drive_linger after the
      // last drive ended: the next call's driver then finds the token free
      // (waking this thread would cost it a wake-up). What arrives meanwhile
      // waits in the kernel's socket buffers for the next driver.
      token.unlock();
      {
        std::unique_lock<std::mutex> lock(park_m);
        for (;;) {
          park_cv.wait_for(lock, k_drive_linger);
          if (drive_wanted.load(std::memory_order_acquire)) continue;
          const auto ended = std::chrono::steady_clock::time_point(
              std::chrono::steady_clock::duration(drive_ended.load(std::memory_order_acquire)));
          if (std::chrono::steady_clock::now() - ended >= k_drive_linger) break;
        }
      }
      token.lock();
      last = std::chrono::steady_clock::now();
      continue;
    }
    if (io.poll() > 0) {
      last = std::chrono::steady_clock::now();
      continue;
    }
    if (io.stopped()) break;
    if (std::chrono::steady_clock::now() - last < spin) continue;
    io.run_one();  // sleeps until the next event (or a driver's wake-up)
    last = std::chrono::steady_clock::now();
  }
}

bool TcpMesh::Impl::drive(const std::function<bool()>& done, const std::function<void()>& check) {
  using clock = std::chrono::steady_clock;
  if (opts.caller_drives <= 0 || in_io_thread() || io.stopped()) return false;
  std::unique_lock<std::mutex> one(drivers, std::try_to_lock);
  if (!one.owns_lock()) return false;
  {
    std::lock_guard<std::mutex> lock(m);
    if (closed_) return false;
  }
  drive_wanted.store(true, std::memory_order_release);
  asio::post(io, [] {});  // an I/O thread asleep in epoll wakes up to stand aside
  std::unique_lock<std::mutex> token(drive_token, std::defer_lock);
  // A polling I/O thread hands over within microseconds; one that is busy or
  // asleep is waited for.
  const auto t0 = clock::now();
  while (!token.try_lock()) {
    if (clock::now() - t0 > std::chrono::microseconds(50)) {
      token.lock();
      break;
    }
    std::this_thread::yield();
  }
  struct Release {
    Impl* im;
    std::unique_lock<std::mutex>& token;
    ~Release() {
      token.unlock();
      im->drive_ended.store(std::chrono::steady_clock::now().time_since_epoch().count(), std::memory_order_release);
      im->drive_wanted.store(false, std::memory_order_release);
    }
  } release{this, token};
  const auto spin = std::chrono::microseconds(std::max(0, opts.poll_us));
  constexpr auto k_check = std::chrono::milliseconds(2);
  auto last = clock::now(), next_check = last + k_check;
  while (!done()) {
    if (io.stopped()) break;
    const auto now = clock::now();
    if (now >= next_check) {
      check();
      next_check = clock::now() + k_check;
    }
    if (io.poll() > 0) {
      last = clock::now();
      continue;
    }
    if (done() || io.stopped()) break;
    if (clock::now() - last < spin) continue;
    io.run_one_for(std::max(std::chrono::duration_cast<std::chrono::microseconds>(next_check - clock::now()),
                            std::chrono::microseconds(1)));
    last = clock::now();
  }
  return true;
}

void TcpMesh::Impl::close() {
  if (in_io_thread())
    throw StateError(k_op, "close() called from a completion callback of the mesh", rank);
  std::vector<std::thread> rejoiners;
  {
    std::lock_guard<std::mutex> lock(rejoin_m);
    stop_rejoin = true;  // reconnect_peer's threads give up within 50 ms; no new one starts
    rejoiners.swap(rejoin_threads);
  }
  for (auto& t : rejoiners) t.join();
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
  resolve_settings(options, rank);
  try {
    impl_ = std::make_shared<Impl>(std::move(listener.impl_), rank, world_size, std::move(options));
    impl_->establish(endpoints, timeout);
    impl_->start_threads();
  } catch (const boost::system::system_error& e) {
    // An event loop or a socket the process has no descriptor for: named on
    // this rank (its peers see it gone). What was opened closes with impl_.
    throw IOError(k_op, "cannot set up the data plane: " + errno_text(e.code().value()), rank);
  }
}

TcpMesh::~TcpMesh() {
  if (impl_) impl_->close();
}

int TcpMesh::rank() const noexcept { return impl_->rank; }
int TcpMesh::world_size() const noexcept { return impl_->world; }
int TcpMesh::streams() const noexcept { return impl_->streams; }
BufferPool& TcpMesh::buffers() noexcept { return impl_->pool; }
int TcpMesh::poll_us() const noexcept { return impl_->opts.poll_us; }

int TcpMesh::default_poll_us(int ranks_on_host) {
  // Two threads per rank (its caller and its mesh's I/O thread) each on a
  // CPU of their own; where they are not, a polling thread takes the CPU
  // from the one it waits for (2 x 2 ranks on 2 CPUs: 4 KiB calls 5x slower).
  return 2 * std::max(1, ranks_on_host) <= hardware_threads() ? 200 : 0;
}

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

bool TcpMesh::drive(const std::function<bool()>& done, const std::function<void()>& check) {
  return impl_->drive(done, check);
}

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
  std::lock_guard<std::mutex> lock(impl_->peers_m);  // reconnect_peer swaps the entry
  return impl_->peers[peer]->lost_flag.load();
}

void TcpMesh::close() { impl_->close(); }

}  // namespace dopt::transport
