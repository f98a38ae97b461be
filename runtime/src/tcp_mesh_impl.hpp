#pragma once
// Internal to TcpMesh: the state of a mesh (TcpMesh::Impl) and of a listener,
// shared by the files that implement it. Not installed.
//   tcp_setup.cpp     listen(), and establish(): the connections, dopt's
//                     handshake and the hello on each
//   tcp_control.cpp   the control connections (I/O thread): sending,
//                     matching messages to recvs, striped message headers
//   tcp_lanes.cpp     the data connections (one lane thread per index): the
//                     pieces of striped messages
//   tcp_rejoin.cpp    reconnect_peer(): a member's connections to a
//                     replacement, and their installation
//   tcp_settings.cpp  the DOPT_TCP_* settings
//   tcp_transport.cpp the threads, close(), and TcpMesh's public functions
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <boost/asio.hpp>

#include "dopt/runtime/error.hpp"
#include "dopt/runtime/internal/tcp_transport.hpp"
#include "tcp_wire.hpp"

namespace dopt::transport {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

struct TcpListener::Impl {
  asio::io_context io{1};
  tcp::acceptor acceptor{io};
  std::uint16_t port = 0;
};

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
    BufferPool::Lease data;  // from pool: reused memory, no page faults
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
    tcp_detail::PieceHeader hdr;
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
    tcp_detail::PieceHeader rhdr{};
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
    std::vector<tcp_detail::Header> whdrs;
    std::vector<asio::const_buffer> wbufs;
    bool writing = false;
    std::uint32_t send_seq = 0;
    // receive side
    tcp_detail::Header rhdr{};
    std::uint32_t recv_seq = 0;
    std::map<Tag, std::deque<RecvOp>> posted;
    std::map<Tag, std::deque<std::shared_ptr<Early>>> early;
    std::map<Tag, std::deque<std::shared_ptr<Slot>>> inorder;
  };

  std::unique_ptr<TcpListener::Impl> lis;  // owns the io_context (declared first: dies last)
  BufferPool pool;  // early messages' buffers, the collectives' scratch (leases may outlive it)
  asio::io_context& io;
  int rank;
  int world;
  TcpMeshOptions opts;
  int streams;
  std::vector<std::unique_ptr<Lane>> lanes;  // before peers: their sockets die first
  std::vector<std::unique_ptr<Peer>> peers;
  // Replacing a peer (tcp_rejoin.cpp): the peers whose reconnection is under
  // way, with the operations requested meanwhile (I/O thread); the replaced
  // Peer states (their sockets' last handlers still point at them); the
  // reconnecting threads (joined by close()). peers_m guards swapping an
  // entry of `peers` against peer_lost() from other threads.
  std::map<int, std::vector<std::function<void()>>> rejoining;
  std::vector<std::unique_ptr<Peer>> retired;
  mutable std::mutex peers_m;
  std::mutex rejoin_m;
  std::vector<std::thread> rejoin_threads;
  std::atomic<bool> stop_rejoin{false};

  std::mutex m;            // guards closed_ and posting from foreign threads
  bool closed_ = false;    // no more operations accepted from foreign threads
  bool closing_ = false;   // I/O thread: shutdown in progress
  std::exception_ptr closed_err;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> guard;
  std::thread thread;

  // Driving (drive()): the thread that runs io holds drive_token; a caller
  // that wants to drive sets drive_wanted, and the I/O thread hands it the
  // token and stands aside until k_drive_linger after the last drive ended
  // (drive_ended, steady clock ticks). One caller drives at a time (drivers).
  static constexpr std::chrono::microseconds k_drive_linger{1000};
  std::mutex drive_token;
  std::mutex drivers;
  std::atomic<bool> drive_wanted{false};
  std::atomic<std::int64_t> drive_ended{0};
  std::mutex park_m;
  std::condition_variable park_cv;

  Impl(std::unique_ptr<TcpListener::Impl> l, int r, int w, TcpMeshOptions o);
  ~Impl();

  void deliver(Completion cb, std::exception_ptr e) {
    asio::post(io, [cb = std::move(cb), e = std::move(e)]() mutable { tcp_detail::call(cb, std::move(e)); });
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

  // ---- setup (tcp_setup.cpp; runs the io_context on the constructing thread) ---
  void establish(const std::vector<std::string>& endpoints, std::chrono::milliseconds timeout);
  bool connected(int peer, int conn) const {
    return conn == 0 ? bool(peers[peer]->sock) : bool(peers[peer]->data[conn - 1]->sock);
  }
  bool fully_connected(int peer) const {
    for (int c = 0; c <= streams; ++c)
      if (!connected(peer, c)) return false;
    return true;
  }

  // ---- replacing a peer (tcp_rejoin.cpp) ---------------------------------------
  bool accepts(int peer) const {
    return std::find(opts.accept_from.begin(), opts.accept_from.end(), peer) != opts.accept_from.end();
  }
  void reconnect(int peer, const std::string& endpoint, std::chrono::milliseconds timeout);  // its thread
  void install(int peer, std::unique_ptr<tcp::socket> ctl, std::vector<std::unique_ptr<tcp::socket>> data);
  void rejoin_done(int peer);  // I/O thread: runs the operations that waited
  /// I/O thread: true when op was kept until peer's reconnection ends.
  bool park(int peer, std::function<void()> op) {
    auto it = rejoining.find(peer);
    if (it == rejoining.end()) return false;
    it->second.push_back(std::move(op));
    return true;
  }

  // ---- I/O thread (tcp_control.cpp) -------------------------------------------
  std::exception_ptr failure(Peer& p) const { return p.lost ? p.lost : closed_err; }

  void lose(Peer& p, const std::string& why);
  void fail_queued(Peer& p, const std::exception_ptr& e);
  void part_done(Peer& p, const std::shared_ptr<Striped>& st, const std::string& why);
  std::uint32_t pieces_for(std::size_t n) const {
    if (streams == 0 || n < opts.stripe_min_bytes) return 0;
    return std::uint32_t(std::min<std::size_t>(std::size_t(streams), n / opts.stripe_min_bytes));
  }
  void do_send(int peer, SendOp op);
  void start_write(Peer& p);
  Completion ordered(Peer& p, Tag tag, Completion done);
  void do_recv(int peer, Tag tag, RecvOp op);
  void finish_early(Peer& p, Tag tag, Early& msg, RecvOp op);
  void drop_early(Peer& p, Tag tag, const std::shared_ptr<Early>& msg);
  std::exception_ptr mismatch(const Peer& p, Tag tag, std::size_t got, std::size_t want) const;
  void read_header(Peer& p);
  void on_header(Peer& p);
  /// The oldest recv posted on p for tag, taken off the queue with its
  /// completion put in message order; nullopt when none is posted.
  std::optional<RecvOp> take_posted(Peer& p, Tag tag);
  void on_striped_header(Peer& p);
  void read_early(Peer& p, Tag tag, std::size_t len, bool queue);

  // ---- lane threads (tcp_lanes.cpp: a data connection's socket and queues) -----
  void kill_data(Peer& p, const std::string& why);  // I/O thread
  void post_done(PieceDone done, std::string why);
  void lane_kill(DataConn& c, const std::string& why);
  void lane_send(DataConn& c, Piece pc);
  void lane_write(DataConn& c);
  void lane_expect(DataConn& c, Piece pc);
  void lane_read(DataConn& c);

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
    if (closed_) throw StateError(tcp_detail::k_op, "the mesh is closed", rank);
    asio::post(io, std::forward<F>(fn));
  }

  void check_peer(int peer, const char* what) const {
    if (peer < 0 || peer >= world || peer == rank)
      throw ValueError(std::string(tcp_detail::k_op) + " " + what,
                       "peer " + std::to_string(peer) + " is not another rank of a world of " +
                           std::to_string(world),
                       rank);
  }

  // ---- lifetime (tcp_transport.cpp) --------------------------------------------
  void start_threads();
  void run_io();  // the I/O thread's loop (polls opts.poll_us after each event)
  bool drive(const std::function<bool()>& done, const std::function<void()>& check);
  void shutdown_all();  // I/O thread
  void close();
};

}  // namespace dopt::transport
