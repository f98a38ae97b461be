#pragma once
// dopt::ProcessGroup: collectives between the ranks of a group.
//
// Every rank of a group makes the same calls in the same order (like
// torch.distributed). Each call gets the group's next sequence number; the
// rank actors match calls by (group id, sequence number) and compare what the
// ranks asked for (collective, reduce op, dtype, shape, root). A difference
// fails the call on every rank involved with CollectiveMismatchError naming
// both calls. Every wait is bounded by the group's timeout (default
// RuntimeOptions::collective_timeout, 300 s): when it expires the call fails
// with TimeoutError naming the ranks that did not arrive, and the group is
// unusable afterwards on that rank (its later calls fail with TimeoutError,
// like an aborted NCCL communicator). When a rank fails (its function threw,
// see simulate()), calls that still wait for it fail with PeerLostError
// naming it.
//
// Ranks passed to the methods (src, dst, root) are ranks *in this group*
// (0 .. size()-1), like the methods of torch's c10d ProcessGroup; use
// global_rank() / group_rank() to convert.
//
// Tensors: dense CPU tensors of float32, float64, float16, bfloat16, int32,
// int64 (int8/uint8 work too; bool only for broadcast/all_gather/send/recv).
// Between simulated ranks (one process) tensors travel by reference: no
// copies are made other than the output writes themselves. A tensor passed to
// an async call must not be touched until its future is ready.
// CUDA tensors go to the device backend that gpu::init() registers (NCCL;
// dopt/gpu/nccl.hpp, docs/gpu.md); without one they are a
// DeviceError.
//
// Reductions: element i of the result is
//   ((x_0[i] op x_1[i]) op x_2[i]) ... op x_{n-1}[i]
// in group-rank order, accumulated in T (float32 for float16/bfloat16, rounded
// once at the end), so results are bit-identical on every run and on every
// rank. avg is the sum divided by size() (floating point only, as in torch).
// The work is split: group rank r reduces elements [r*n/size, (r+1)*n/size)
// and writes them to every rank's output (reduce-scatter + all-gather in one
// pass), on rank r's actor.
//
// Errors: bad arguments (undefined/non-CPU tensor, wrong dtype, shape or list
// size, rank out of range) throw synchronously from both forms, before the
// call takes a sequence number. Errors of the collective itself arrive in the
// future (async form) or are thrown (blocking form).
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "dopt/actors/future.hpp"
#include "dopt/runtime/tensor.hpp"

namespace dopt {

enum class ReduceOp : std::uint8_t { sum, avg, product, min, max };
std::string_view reduce_op_name(ReduceOp op) noexcept;

/// The order in which a reduction combines the ranks' contributions.
enum class ReduceOrder : std::uint8_t {
  /// Group rank 0, 1, ..., n-1: dopt's order, on every plane.
  rank,
  /// gloo's ring all_reduce order, what torch 1.13 computes for CPU tensors:
  /// the flat buffer is cut into n runs of segments (segments of at most
  /// 1 MiB), and the sum of run b starts at rank b - 1 and goes down the ring
  /// to rank b. Bitwise torch's result for float32/float64 sums at 3 or more
  /// ranks (at 2 ranks both orders agree; 16-bit floats keep rank order).
  ring,
};

struct AllReduceCoalescedOptions {
  ReduceOp op = ReduceOp::sum;
  ReduceOrder order = ReduceOrder::rank;
  /// > 0: every rank's values are divided by this first, in their dtype (as
  /// torch's `t / d`), then reduced: torch's model averaging (parameters
  /// divided by the world size, then summed) folded into one pass. Sum of
  /// floating-point tensors only.
  std::int64_t pre_divisor = 0;
};

struct Subgroups;
struct ShrinkResult;
struct GrowResult;

/// ProcessGroup::grow()'s arguments.
struct GrowOptions {
  /// How many newcomers to admit (>= 1, else ValueError): grow() waits until
  /// that many newcomers of this job called join_group().
  int newcomers = 1;
};

/// ProcessGroup::join_group()'s arguments: the newcomer's credentials. The
/// members admit only a newcomer whose job id and secret are the job's (in
/// simulate(): SimulateOptions::job_id and ::secret).
struct JoinGroupOptions {
  std::string job_id;
  std::string secret;
};

/// What a group runs on (diagnostics): "shm" (shared memory, ranks on one
/// host), "hier" (shared memory within hosts, TCP between them), "actor"
/// (messages between rank actors: simulated ranks with the actor plane, or
/// processes over TCP), how many bytes this rank sent to other hosts
/// through it (the hierarchical plane and MPI; 0 elsewhere), and how many it
/// read straight from the memory of ranks on its host with cross-memory
/// attach (the hierarchical plane's all_gather; 0 elsewhere).
struct PlaneStats {
  std::string plane;
  std::uint64_t bytes_to_other_hosts = 0;
  std::uint64_t bytes_read_from_host_peers = 0;
};

class ProcessGroup {
 public:
  /// The group's state (opaque: defined and used by the library only; a
  /// handle and its copies share one).
  struct Impl;
  /// The library's own access to the private constructor and state (opaque).
  struct Access;

  /// An invalid group (valid() == false).
  ProcessGroup() = default;

  bool valid() const noexcept { return impl_ != nullptr; }
  /// False for the handle a rank gets for a group it is not in.
  bool is_member() const;
  /// This rank's rank in the group (-1 when not a member).
  int rank() const;
  int size() const;
  /// Global ranks of the members, ascending; index = group rank.
  const std::vector<int>& ranks() const;
  int global_rank(int group_rank) const;
  /// -1 when global_rank is not a member.
  int group_rank(int global_rank) const;
  std::uint64_t id() const;

  std::chrono::milliseconds timeout() const;
  /// Which plane this rank's part of the group runs on, and its traffic.
  PlaneStats plane_stats() const;
  /// Sets the timeout for this rank's later calls on this group.
  void set_timeout(std::chrono::milliseconds timeout);

  // --- collectives (async) -------------------------------------------------------
  /// tensor on every rank <- tensor of rank src.
  Future<void> broadcast_async(const Tensor& tensor, int src);
  /// tensor (in place) <- op over every rank's tensor.
  Future<void> all_reduce_async(const Tensor& tensor, ReduceOp op = ReduceOp::sum);
  /// tensor of rank dst <- op over every rank's tensor; other ranks' tensors unchanged.
  Future<void> reduce_async(const Tensor& tensor, int dst, ReduceOp op = ReduceOp::sum);
  /// outputs[k] <- input of rank k. outputs.size() == size(), each shaped like input.
  Future<void> all_gather_async(const std::vector<Tensor>& outputs, const Tensor& input);
  /// output (numel = size() * input.numel()) <- inputs of ranks 0..size-1, concatenated.
  Future<void> all_gather_into_tensor_async(const Tensor& output, const Tensor& input);
  /// output of rank r <- op over inputs[r] of every rank. inputs.size() == size().
  Future<void> reduce_scatter_async(const Tensor& output, const std::vector<Tensor>& inputs,
                                    ReduceOp op = ReduceOp::sum);
  Future<void> barrier_async();
  /// Completes when rank dst's matching recv has copied the data.
  Future<void> send_async(const Tensor& tensor, int dst, int tag = 0);
  /// Fills tensor with the matching send of rank src (same dtype and shape).
  Future<void> recv_async(const Tensor& tensor, int src, int tag = 0);

  /// tensors of every rank, seen as one flat buffer in list order (one dtype;
  /// every rank passes the same shapes) <- options.op over the ranks'
  /// buffers, in one call and without a copy into a flat buffer (torch:
  /// all_reduce_coalesced). See AllReduceCoalescedOptions.
  Future<void> all_reduce_coalesced_async(const std::vector<Tensor>& tensors,
                                          const AllReduceCoalescedOptions& options = {});
  /// Every tensor of the list <- rank src's, in one call (dtypes may differ;
  /// every rank passes the same dtypes and shapes).
  Future<void> broadcast_coalesced_async(const std::vector<Tensor>& tensors, int src);

  // --- collectives (blocking) -------------------------------------------------------
  // The same calls, returning when done (or throwing the error). On the
  // shared-memory plane the work runs on the calling thread when no earlier
  // async call of this group is still queued.
  void broadcast(const Tensor& tensor, int src);
  void all_reduce(const Tensor& tensor, ReduceOp op = ReduceOp::sum);
  void reduce(const Tensor& tensor, int dst, ReduceOp op = ReduceOp::sum);
  void all_gather(const std::vector<Tensor>& outputs, const Tensor& input);
  void all_gather_into_tensor(const Tensor& output, const Tensor& input);
  void reduce_scatter(const Tensor& output, const std::vector<Tensor>& inputs, ReduceOp op = ReduceOp::sum);
  void barrier();
  void all_reduce_coalesced(const std::vector<Tensor>& tensors, const AllReduceCoalescedOptions& options = {});
  void broadcast_coalesced(const std::vector<Tensor>& tensors, int src);
  void send(const Tensor& tensor, int dst, int tag = 0) { send_async(tensor, dst, tag).get(); }
  void recv(const Tensor& tensor, int src, int tag = 0) { recv_async(tensor, src, tag).get(); }

  // --- subgroups (call on the world group, on every rank, in the same order) -----
  /// A group of the given global ranks (sorted; duplicates or out-of-range ranks
  /// throw ValueError). Every rank of the world calls it (it is a world
  /// collective, so inconsistent calls raise CollectiveMismatchError); ranks
  /// outside get a handle with is_member() == false.
  ProcessGroup new_group(std::vector<int> ranks);
  /// Splits the world into consecutive groups of group_size ranks (0: one
  /// group per node; simulated ranks are all on one node). size() must be
  /// divisible by group_size.
  Subgroups new_subgroups(int group_size = 0);

  // --- losing members ---------------------------------------------------------------
  /// The surviving members of this group agree on a new group without the
  /// members that were lost (process exit, kill, liveness silence) or whose
  /// user code failed, and return it. Call it on every surviving member,
  /// typically after a call failed with PeerLostError; it is a collective of
  /// the survivors (this group's own calls are not used: it may be broken).
  ///
  /// The survivors meet on their rank actors, which outlive a lost peer:
  /// each proposes the members it sees alive; a member that sees a further
  /// loss while they meet proposes again without it, until every survivor
  /// proposed the same members. The new group has a fresh id, sequence
  /// numbers from 0 and fresh data-plane state (on the shared-memory plane:
  /// new regions), so nothing of this group (its rounds, its messages) can be
  /// taken for the new one's. Two survivors that saw a second loss at
  /// different moments still meet: the id depends only on the first group
  /// of the line (this group, or the one it was shrunk from) and the members.
  /// Every member of the new group has the same ranks(), in ascending global
  /// rank order; group ranks are renumbered 0..n-1 (result.new_rank).
  ///
  /// Planes: a group on the shared-memory plane gets a shared-memory group;
  /// one on the actor plane (simulated ranks with plane "actor", processes
  /// over TCP) an actor-plane group; one on the hierarchical plane an
  /// actor-plane group (its messages and ring collectives over the TCP mesh).
  /// A shrunk group cannot make subgroups (new_group, new_subgroups): shrink
  /// the subgroups made before the loss instead. Bounded by this group's
  /// timeout (TimeoutError naming the members that did not come). This
  /// group stays as it is (broken where a member was lost).
  ///
  /// Who goes on (processes; simulated ranks see every loss exactly): a
  /// member lost only by silence may be a stopped process, or on the other
  /// side of a partition, and shrink there too. So a survivor goes on only
  /// when the members it sees alive outnumber those lost by silence alone
  /// (members whose process is known gone count for neither side), or match
  /// them and hold the lowest rank of both; otherwise StateError "this rank
  /// is cut off: ..." (not a PeerLostError: calling shrink again cannot help,
  /// the rank must stop). Losses seen just after this process did not run
  /// for longer than the peer timeout (it was stopped) count as suspected. A
  /// rank that its peers declared lost and heard from again is removed: its
  /// calls fail with PeerLostError and shrink raises
  /// StateError "this rank cannot go on: ... it was removed from the job;
  /// it cannot rejoin" (docs/fault-tolerance.md, "Who goes on").
  ShrinkResult shrink();

  // --- gaining members ----------------------------------------------------------------
  /// The members of this group and options.newcomers newcomers agree on a new
  /// group of all of them, and return it. Call it on every member, at a step
  /// boundary (no call of this group in flight: a newcomer waiting to join
  /// waits until then); it is a collective of the members and the newcomers
  /// (this group's own calls are not used). Blocks the calling thread (the
  /// rank's thread) until every member and newcomer attached to the new
  /// group, or it failed; bounded by this group's timeout (TimeoutError
  /// saying how many newcomers came).
  ///
  /// The new group: this group's members and the admitted newcomers, in
  /// ascending global rank order, group ranks 0..n-1, a fresh id, sequence
  /// numbers from 0 and fresh data-plane state; it is a new line for
  /// shrink() (it shrinks to groups of its own, never back to one of this
  /// group's line). Admitted: the newcomers with the lowest global ranks
  /// among those waiting whose job id and secret are the job's (the others
  /// are refused: their join_group() throws AuthenticationError, and the
  /// members go on waiting). It cannot make subgroups (like a shrunk group).
  ///
  /// A member lost while they meet fails grow() on the other members with
  /// PeerLostError naming it; the newcomers keep waiting, so the survivors
  /// shrink() this group and grow() the result (the rules of shrink()). A
  /// newcomer lost while they meet: PeerLostError naming it; grow() again.
  /// This group stays as it is.
  ///
  /// Where: between the ranks of a deterministic simulation (simulate()
  /// with deterministic = true and SimulateOptions::newcomers), and between
  /// processes on the shm plane and on the actor plane (DOPT_TRANSPORT=tcp,
  /// and the groups that shrink() makes on the hierarchical plane), where
  /// the newcomers are replacements of lost ranks (dopt-run --on-failure
  /// replace: each takes its lost rank's number with a new incarnation, and
  /// rank 0 admits it; rank 0 itself cannot be replaced). The grown group
  /// runs on the old group's plane and its calls carry buffers of any size
  /// (shm: new regions, the replacement's among them; actor: the members'
  /// TCP meshes connect to the replacement's as it joins;
  /// docs/growing-back-processes.md "Between processes"). Elsewhere
  /// NotSupportedError naming the call and the plane: a group on the
  /// hierarchical plane itself cannot grow yet; the MPI plane cannot grow
  /// (an MPI communicator's members are fixed at MPI_Init; use dopt's own
  /// planes for an elastic job). StateError on a newcomer's handle.
  GrowResult grow(const GrowOptions& options = {});
  /// A newcomer's side of grow(): called once on the handle of the job this
  /// rank is not yet a member of (a newcomer's RankContext::world(), or what
  /// init_process_group returned in a replacement process), on
  /// the rank's thread; blocks until the members admitted it and the new
  /// group is ready, and returns it (GrowResult::new_rank empty). A
  /// newcomer whose credentials are not the job's: AuthenticationError
  /// naming the call and rank, at once. Bounded by the handle's timeout (TimeoutError: no member grew the
  /// group meanwhile); between processes, PeerLostError naming the call and rank as soon as every member is gone
  /// (the job ended). StateError on a member's handle; NotSupportedError where grow() is.
  GrowResult join_group(const JoinGroupOptions& options = {});
  /// Collective of this group's members (every member calls it, at a step
  /// boundary, on its rank's thread; newcomers do not): how many newcomers
  /// wait to join this group now, as its lowest member sees them, agreed by
  /// one broadcast from that member, so every member returns the same count
  /// and may call grow() on it together without waiting for anyone. Waiting:
  /// in a deterministic simulation, newcomers of this job in join_group() not
  /// yet admitted; between processes, replacements of lost ranks that rank 0
  /// admitted to the job (dopt-run --on-failure replace) and that are not
  /// members. Blocks until the broadcast completes (PeerLostError as for the
  /// group's other calls, bounded by its timeout). NotSupportedError where
  /// grow() is; StateError on a newcomer's handle.
  int newcomers_waiting();

 private:
  explicit ProcessGroup(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  Impl& member(const char* op) const;
  Future<void> broadcast_impl(const Tensor& tensor, int src, bool blocking);
  Future<void> all_reduce_impl(const Tensor& tensor, ReduceOp op, bool blocking);
  Future<void> reduce_impl(const Tensor& tensor, int dst, ReduceOp op, bool blocking);
  Future<void> all_gather_impl(const std::vector<Tensor>& outputs, const Tensor& input, bool blocking);
  Future<void> all_gather_into_tensor_impl(const Tensor& output, const Tensor& input, bool blocking);
  Future<void> reduce_scatter_impl(const Tensor& output, const std::vector<Tensor>& inputs, ReduceOp op,
                                   bool blocking);
  Future<void> barrier_impl(bool blocking);
  Future<void> all_reduce_coalesced_impl(const std::vector<Tensor>& tensors, const AllReduceCoalescedOptions& options,
                                         bool blocking);
  Future<void> broadcast_coalesced_impl(const std::vector<Tensor>& tensors, int src, bool blocking);
  std::shared_ptr<Impl> impl_;
};

/// What ProcessGroup::shrink() made.
struct ShrinkResult {
  /// The group of the surviving members.
  ProcessGroup group;
  /// new_rank[r]: the rank in `group` of rank r of the old group (-1: lost).
  std::vector<int> new_rank;
  /// Ranks of the old group that were left out, ascending.
  std::vector<int> lost;
};

/// What ProcessGroup::grow() and join_group() made.
struct GrowResult {
  /// The group of the old members and the newcomers.
  ProcessGroup group;
  /// Members: new_rank[r] is the rank in `group` of rank r of the old group
  /// (empty on a newcomer).
  std::vector<int> new_rank;
  /// The newcomers' global ranks, ascending (group.group_rank(g) gives each one's rank).
  std::vector<int> joined;
};

struct Subgroups {
  /// The subgroup this rank is in.
  ProcessGroup current;
  /// All subgroups, in order of their first rank.
  std::vector<ProcessGroup> all;
};

}  // namespace dopt
