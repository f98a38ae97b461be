#pragma once
// The hierarchical plane: a group whose members are on several hosts, each
// host with the same number L of them. Within a host the members meet on the
// shared-memory plane's rounds (a Channel over the host's members); between
// hosts the member with local index j talks to the members with local index
// j of the other hosts (its "cross peers") over the TCP mesh. Every
// collective is two-level: the bytes that cross hosts are split L ways, each
// of a host's members carrying its own slice in parallel, so a job on two
// hosts is limited by the network, not by copies of same-host traffic.
//
// Reductions keep dopt's order bit for bit: element i is combined in the
// group's order (rank order, or gloo's ring order) by passing an accumulator
// (float32 for 16-bit floats) along the hosts in that order, each host adding
// its members' values; the last host finishes it and sends the result back.
//
// Matching: the members of a host compare their calls on the shared-memory
// plane; then every member swaps a record of its call and of its host's
// verdict with its cross peers, so every member sees every host's verdict and
// all of them fail alike on a mismatch. Waits are bounded by the call's
// timeout and by the peers' liveness, as on the shared-memory plane.
//
// Threads: as the shared-memory plane (SerialExecutor); the TCP mesh's
// completions wake the waiting thread.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dopt/runtime/internal/tcp_transport.hpp"
#include "plane/executor.hpp"
#include "dopt/actors/internal/group_plane.hpp"
#include "transport/shm/channel.hpp"

namespace dopt::detail::hier {

/// The plane's local part is the shared-memory plane's channel.
using shm_plane::Channel;

/// Who is where: the group's members by host.
struct Topology {
  std::vector<int> members;                 // global ranks, ascending (group rank = index)
  std::vector<std::vector<int>> hosts;      // group ranks on each host (hosts ordered by their lowest member)
  std::vector<int> host_of;                 // group rank -> host index
  std::vector<int> local_of;                // group rank -> index on its host
  int me = 0;                               // my group rank
  int host() const { return host_of[static_cast<std::size_t>(me)]; }
  int local() const { return local_of[static_cast<std::size_t>(me)]; }
  int per_host() const { return static_cast<int>(hosts[0].size()); }
  int num_hosts() const { return static_cast<int>(hosts.size()); }
  /// The member with local index j on host h (group rank).
  int at(int h, int j) const { return hosts[static_cast<std::size_t>(h)][static_cast<std::size_t>(j)]; }
  /// Groups of members per host (host ids per group rank); throws if the
  /// hosts hold different numbers of members.
  static Topology make(std::vector<int> members, const std::vector<std::string>& host_ids, int me);
};

/// Transfers on the TCP mesh whose completion a thread waits for.
class Transfers {
 public:
  explicit Transfers(transport::TcpMesh& mesh) : mesh_(mesh), s_(std::make_shared<State>()) {}
  /// keep: what must outlive the transfer (its completion may come after a
  /// failed wait gave up on it).
  void send(int peer, transport::Tag tag, const void* data, std::size_t n, std::shared_ptr<void> keep = nullptr);
  void recv(int peer, transport::Tag tag, void* data, std::size_t n, std::shared_ptr<void> keep = nullptr);
  /// Counts one more pending transfer (a whole collective of dopt/actors/internal/ring.hpp,
  /// for instance) settled by the completion returned; keep as for send.
  transport::Completion expect(std::shared_ptr<void> keep = nullptr) { return track(std::move(keep)); }
  /// Waits for every posted transfer; `check` runs every 2 ms or so (it
  /// throws to end the wait: timeout, a lost peer, shutdown). With `drive`
  /// this thread runs the mesh's I/O meanwhile where it can
  /// (TcpMesh::drive), else it sleeps until woken. Rethrows a transfer's
  /// error.
  void wait(const std::function<void()>& check, bool drive = true);
  bool pending() const;

 private:
  /// Counts a transfer as pending; the completion it returns settles it.
  transport::Completion track(std::shared_ptr<void> keep);
  struct State {
    std::mutex m;
    std::condition_variable cv;
    int pending = 0;
    std::exception_ptr error;
  };
  transport::TcpMesh& mesh_;
  std::shared_ptr<State> s_;
};

class HierGroup;
class HierPlane;

/// One call while it runs on the hierarchical plane.
struct HierCall {
  shm_plane::Call local;       // for the host's channel (deadline, op)
  std::uint64_t op_id = 0;     // tag hi word on the mesh
  std::uint64_t next_lo = 0;   // (unused)
  bool drives = false;         // its waits drive the mesh (HierGroup::execute decides)
  bool matched = false;        // the hosts matched the call (HierGroup::match returned)
};

class HierGroup final : public GroupPlane, public std::enable_shared_from_this<HierGroup> {
 public:
  /// local: the channel over this host's members (their regions mapped);
  /// mesh: connections to every rank of the world (global ranks).
  HierGroup(std::shared_ptr<HierPlane> plane, std::uint64_t gid, Topology topo,
            std::unique_ptr<shm_plane::Channel> local, std::shared_ptr<transport::TcpMesh> mesh,
            std::shared_ptr<PeerTable> peers);
  ~HierGroup() override;

  void run(const OpPtr& op) override;
  Future<void> run_async(const OpPtr& op) override;
  /// Collectives; send/recv go to the rank actor (their own sequence numbers).
  bool supports(const CollDesc& desc) const override;
  const char* name() const noexcept override { return "hier"; }
  std::shared_ptr<GroupPlane> made_group(std::uint64_t gid) const override;
  void stop(const std::string& why) { exec_.stop(why); }

  // --- for the algorithms (hier_*.cpp) ------------------------------------------------
  const Topology& topo() const noexcept { return topo_; }
  shm_plane::Channel& local() noexcept { return *local_; }
  transport::TcpMesh& mesh() noexcept { return *mesh_; }
  std::uint64_t gid() const noexcept { return gid_; }
  int global(int grank) const { return topo_.members[static_cast<std::size_t>(grank)]; }
  /// The phases of the plane's message streams, one per use, so that no two collide.
  enum Phase : std::uint32_t {
    kRecords = 1,  // the match records the hosts exchange
    kChain = 2,    // all_reduce: accumulators along the hosts
    kResult = 3,   // all_reduce: finished slices back
    kSlice = 4,    // broadcast: the root host's slices
    kGather = 5,   // all_gather: each host's chunk
  };
  /// Mesh tag of message stream (phase, a, b) of call c.
  transport::Tag tag(const HierCall& c, Phase phase, std::uint64_t a, std::uint64_t b = 0) const;
  /// Waits for ts; bounded by c's deadline and the liveness of `waiting_for`
  /// (group ranks); a failure breaks the group (later calls fail alike).
  void wait(Transfers& ts, HierCall& c, const std::vector<int>& waiting_for);
  /// Bytes this rank sent to other hosts (tests assert the two-level path).
  std::uint64_t bytes_to_other_hosts() const noexcept override { return cross_bytes_.load(std::memory_order_relaxed); }
  void count_cross(std::uint64_t n) noexcept { cross_bytes_.fetch_add(n, std::memory_order_relaxed); }
  /// Bytes read from host peers' memory (tests assert the cross-memory path).
  std::uint64_t bytes_read_from_host_peers() const noexcept override { return cma_bytes_.load(std::memory_order_relaxed); }
  void count_cma(std::uint64_t n) noexcept { cma_bytes_.fetch_add(n, std::memory_order_relaxed); }
  /// At least n bytes of scratch memory (not zeroed), reused from call to
  /// call on the group's thread: the algorithms' accumulators. Transfers that
  /// use it hold the pointer (a failed wait may leave them in flight).
  std::shared_ptr<char[]> scratch(std::size_t n);
  /// The first round of a call on this host, then the exchange of records
  /// with the cross peers: throws CollectiveMismatchError on every member alike.
  /// Stages nothing: the algorithms stage their first chunk themselves, before.
  void match(std::uint64_t round, HierCall& c);
  /// A call's first round with nothing staged but `entries` (may be empty):
  /// this member writes them at the start of its buffer, publishes the call,
  /// meets the host's members, and match()es. Returns the round.
  std::uint64_t meet(HierCall& c, const std::vector<std::uint64_t>& entries = {});
  /// The host's members are processes: the cross-memory ways may apply.
  bool members_are_processes() const { return local_->shared() && !local_->in_process(); }
  /// After meet(round, c) with `count` entries per member: every member's
  /// entries (index: local index), or nothing when some member cannot read
  /// the others' memory (Channel::p2p_cma_ready) or wrote a 0. Every member
  /// of the host gets the same answer.
  std::vector<std::vector<std::uint64_t>> cross_memory_entries(std::uint64_t round, std::size_t count);
  /// match() without its wait, so that a call's data can travel while the
  /// records do: posts the exchange (after the host's round `round`) and
  /// calls `verdict` once, on the mesh's I/O thread, when the records have
  /// come: nullptr, or what match() would throw (CollectiveMismatchError,
  /// or the records' transfer error). Give it a Transfers' expect() and
  /// wait() for it with the data: the wait ends at the first error, so a
  /// mismatch does not wait for data that will not come. A call that fails
  /// leaves its data transfers behind (their tags are its own; the buffers
  /// must be kept alive by those transfers).
  void start_match(std::uint64_t round, HierCall& c, transport::Completion verdict);

 private:
  void execute(const Op& op);
  void dispatch(HierCall& c);

  std::shared_ptr<HierPlane> plane_;  // lives while any of its groups does
  std::uint64_t gid_;
  Topology topo_;
  std::unique_ptr<shm_plane::Channel> local_;
  std::shared_ptr<transport::TcpMesh> mesh_;
  std::shared_ptr<PeerTable> peers_;
  std::atomic<std::uint64_t> cross_bytes_{0};
  std::atomic<std::uint64_t> cma_bytes_{0};
  std::shared_ptr<char[]> scratch_;
  std::size_t scratch_bytes_ = 0;
  SerialExecutor exec_;
};

// The collectives (hier_*.cpp). Every member calls the same one.
void all_reduce(HierGroup& g, HierCall& c);   // also reduce, reduce_scatter, all_reduce_coalesced
void broadcast(HierGroup& g, HierCall& c);    // also broadcast_coalesced
void all_gather(HierGroup& g, HierCall& c);   // list and flat
void barrier(HierGroup& g, HierCall& c);

// One member per host (hier_ring.cpp): the slices that cross are the whole
// buffer, so there is nothing to stage in shared memory. After the call's
// match, the TCP ring collectives (dopt/actors/internal/ring.hpp: pipelined, reduction
// in the group's order, bit for bit the same) run straight on the tensors'
// memory (packed into one buffer first when they are not one contiguous
// range). Each returns false, having done nothing, when the group has more
// than one member per host.
bool whole_all_reduce(HierGroup& g, HierCall& c, const std::vector<Tensor>& tensors, DType dtype, ReduceOp op);
bool whole_all_gather(HierGroup& g, HierCall& c);

}  // namespace dopt::detail::hier
