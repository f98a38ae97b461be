#pragma once
// One rank's view of one group on the shared-memory plane: every member's
// region, the rounds of the group's calls, and the waits between members.
//
// Protocol. The members run the group's calls in sequence order, each call
// in one or more rounds; every member takes part in every round. In round k
// a member writes its data into its own staging buffer k % 2 (and, in the
// call's first round, its descriptor), then sets its step to A(k); once a
// member's share of round k is written it sets B(k). A member reads a peer's
// buffer only after seeing the step that covers it, and writes its own
// buffer k % 2 again only once every peer reached A(k - 1), i.e. finished
// reading round k - 2. No message is sent: the step words are the mailbox.
//
// Threads: one thread at a time uses a Channel (the group's executor
// serialises the calls); peers' regions are read concurrently by their own
// threads or processes.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "plane/failure.hpp"
#include "dopt/actors/internal/op.hpp"
#include "plane/peer_table.hpp"
#include "transport/shm/board.hpp"
#include "transport/shm/region.hpp"

namespace dopt::detail::shm_plane {

/// How a waiting member burns (or saves) CPU: poll, then yield, then sleep
/// on the peer's futex in slices, checking liveness and the deadline between.
struct WaitPolicy {
  std::chrono::nanoseconds spin{20000};  // polling, before yielding
  int yields = 4;
  std::chrono::microseconds slice{2000};
  /// Less polling when more ranks share this host than it has CPUs.
  static WaitPolicy for_ranks(int ranks_on_host);
};

/// Every member's region, as mapped here.
struct GroupMemory {
  std::shared_ptr<const std::vector<void*>> base;  // index: group rank (threads: one list for all members)
  std::shared_ptr<Board> board;                    // threads of one process: what the members share (else null)
  std::size_t buf_bytes = 0;
  std::size_t small_bytes = 0;  // calls with at most this much data per member take the small path
  std::size_t heap_bytes = 0;   // send/recv staging (processes)
  bool shared = false;      // regions of other processes (futexes are shared)
  bool in_process = false;  // members are threads of this process: their tensors are addressable
  std::shared_ptr<void> keep;  // keeps the mappings / allocations
};

/// One call while it runs: what waits and errors need.
struct Call {
  const Op* op = nullptr;
  const char* name = "";
  std::chrono::steady_clock::time_point deadline;
  std::uint64_t first_round = 0;
};

class Channel {
 public:
  Channel(std::uint64_t gid, int me, std::shared_ptr<const std::vector<int>> members, GroupMemory memory,
          std::shared_ptr<PeerTable> peers, WaitPolicy policy);
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  std::uint64_t gid() const noexcept { return gid_; }
  int me() const noexcept { return me_; }
  int size() const noexcept { return static_cast<int>(members_->size()); }
  int global(int g) const { return (*members_)[static_cast<std::size_t>(g)]; }
  int my_global() const { return global(me_); }
  ControlBlock& ctl(int g) const { return *static_cast<ControlBlock*>(base(g)); }
  char* buf(int g, std::uint64_t round) const { return layout_.buf_of(base(g), round); }
  void* base(int g) const { return bases_[static_cast<std::size_t>(g)]; }
  const Layout& layout() const noexcept { return layout_; }
  bool shared() const noexcept { return memory_.shared; }
  const WaitPolicy& policy() const noexcept { return policy_; }
  std::size_t buf_bytes() const noexcept { return memory_.buf_bytes; }
  std::size_t small_bytes() const noexcept { return memory_.small_bytes; }
  bool in_process() const noexcept { return memory_.in_process; }
  const std::shared_ptr<PeerTable>& peers() const noexcept { return peers_; }

  static constexpr std::uint64_t A(std::uint64_t k) { return 2 * k + 1; }
  static constexpr std::uint64_t B(std::uint64_t k) { return 2 * k + 2; }

  /// Starts call c: throws what a broken group gives; sets c's deadline.
  void begin_call(Call& c);
  /// The next round: waits until every peer finished reading round k - 2.
  std::uint64_t begin_round(Call& c);
  /// Publishes this member's step (A or B of a round).
  void signal(std::uint64_t step);
  /// Waits until member g reached step; throws TimeoutError / PeerLostError /
  /// StateError (and breaks the group on timeout or loss). A loss of any
  /// member (not only g) ends the wait, and is published in this member's
  /// abort line, so that every member's waits and later calls on the group
  /// fail with PeerLostError naming the lost rank (checked between naps,
  /// never in the polling).
  void wait(int g, std::uint64_t step, Call& c);
  /// wait() for every other member (simulated threads: one wait on the
  /// group's Board, not one per member).
  void wait_all(std::uint64_t step, Call& c);
  /// First round of a call: this member's descriptor (before signal(A)).
  void publish(std::uint64_t round, const Op& op);
  /// After wait_all(A(round)) of a call's first round: every member compares
  /// all descriptors, so all of them fail alike on a mismatch (threads: once
  /// one member found them all alike, the others take its word: the Board).
  void match(std::uint64_t round, Call& c);
  /// A call's first round without staged data: begin_round, publish, A,
  /// wait for every member's A, match. Returns the round.
  std::uint64_t meet(Call& c);
  /// A round with nothing staged: returns once every member reached it (a
  /// call's last, where members read each other's memory before it).
  void sync(Call& c);
  /// match() without throwing a mismatch: its message, or "" when all agree.
  std::string mismatch(std::uint64_t round, Call& c);
  /// The checks of a wait that is not on a member's step (shutdown, aborts,
  /// the deadline); throws as wait() does.
  void check(Call& c);
  /// This member gives up the group (a timeout it saw elsewhere) in its call
  /// of sequence number `seq`: `later` is what every member's calls from that
  /// one on (and their waits in progress) fail with, as a TimeoutError, a
  /// PeerLostError with kind peer_lost (a member on another host was lost:
  /// the hierarchical plane), or a StateError with kind state (another error
  /// in the middle of a call on the hierarchical plane). A member still in an earlier call finishes it
  /// (this one did its part) and fails at the same call as the others.
  void abort_group(const std::string& later, FailKind kind = FailKind::timeout, std::uint64_t seq = 0);
  /// Processes: tries process_vm_readv (cross-memory attach, one copy from a
  /// peer's memory into this one's) on every peer's region and publishes
  /// whether all worked. Called once, before this member's first step.
  /// wanted: for the collectives (ControlBlock::cma); p2p: for send/recv
  /// (ControlBlock::p2p_cma).
  void probe_cma(bool wanted, bool p2p = false);
  /// Every member can read every other's memory with cma_read(). Called at
  /// the start of a call; every member gets the same answer (false until the
  /// group ran a call: the flags are set before any member's first step).
  bool cma_ready();
  /// Every member can read every other's memory with cma_read(), by the
  /// send/recv probe (ControlBlock::p2p_cma: on unless DOPT_SHM_CMA=0 or
  /// DOPT_SHM_STAGED=1). Valid once every member reached A of this call's
  /// first round; every member gets the same answer then.
  bool p2p_cma_ready();
  /// Copies n bytes at `remote` (an address in member g's process) to dst.
  /// Throws what a wait would when g is gone, else StateError.
  void cma_read(int g, std::uint64_t remote, char* dst, std::size_t n, Call& c);
  /// The data address member g published for `round` (Desc::data_addr).
  std::uint64_t peer_data(int g, std::uint64_t round) const;
  /// Number of rounds this channel ran.
  std::uint64_t rounds() const noexcept { return next_round_; }
  /// The peer's Op (threads only), from its descriptor of `round`.
  const Op& peer_op(int g, std::uint64_t round) const;

  /// This rank's calls up to seq were submitted (a failed rank still runs them).
  void note_submitted(std::uint64_t seq);
  /// This rank will not run its calls from seq on (they were dropped): its
  /// submitted count goes back to seq, so that peers waiting for them fail
  /// with PeerLostError once this rank is known failed.
  void note_dropped(std::uint64_t seq);
  /// The group cannot be used any more (every later call throws f).
  void break_group(const Failure& f);
  /// A member other than this one that aborted the group at or before the
  /// call of sequence number seq (-1: none).
  int aborted_before(std::uint64_t seq) const;
  bool broken() const noexcept { return broken_.has_value(); }

 private:
  [[noreturn]] void fail_lost(int peer_global, Call& c);
  [[noreturn]] void fail_timeout(std::uint64_t step, Call& c);
  void check_slow(int g, std::uint64_t step, Call& c);
  /// A member that will never take part in this member's current round of
  /// c (lost, or failed before submitting c), the awaited g first; or -1.
  int unable_member(int g, const Call& c) const;
  /// wait() under the deterministic scheduler: true once the step is
  /// there, false when the simulation let go (then wait() goes on as usual).
  bool wait_simulated(int g, std::uint64_t step, Call& c);
  /// wait_all() under the deterministic scheduler, on the Board: true once
  /// every member reached step; false when it cannot tell (this member's own
  /// step is behind: a dropped signal) or the simulation let go.
  bool wait_all_simulated(std::uint64_t step, Call& c);
  /// The first member (group rank) whose step is below step (-1: none).
  int first_below(std::uint64_t step) const;
  /// Under the deterministic scheduler, when a fault plan's partition cuts a
  /// member off: waits out c's (virtual) deadline, then throws PeerLostError
  /// naming that member; else returns at once.
  void check_partition(Call& c);
  std::string group_str() const;
  std::string what(const Call& c) const;

  std::uint64_t gid_;
  int me_;
  std::shared_ptr<const std::vector<int>> members_;
  GroupMemory memory_;
  std::shared_ptr<PeerTable> peers_;
  WaitPolicy policy_;
  /// How long waits poll before yielding: halved after a wait that polling
  /// did not serve (down to 1 us), back to policy_.spin after one it did and
  /// every 64th wait (to look again), so a rank whose peers are busy or
  /// descheduled stops taking the CPU from them.
  std::chrono::nanoseconds spin_{0};
  std::uint32_t waits_ = 0;
  void* const* bases_;  // memory_.base's data
  Layout layout_;
  std::uint64_t next_round_ = 0;
  std::optional<Failure> broken_;
  bool cma_all_ = false;
  bool p2p_cma_all_ = false;
};

}  // namespace dopt::detail::shm_plane
