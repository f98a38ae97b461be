#pragma once
// Collective algorithms over the TCP data plane (dopt::transport::TcpMesh):
// the machinery of the TCP plane (actors/src/transport/tcp/, one file per
// collective), not an API of its own; names here may change. The transport
// benchmark drives them on a mesh of its own.
//
// A group is a list of global ranks (mesh ranks); ring order = group-rank
// order = the order of `ranks`. Every member calls the same function with the
// same arguments (sizes, dtype, op, root, RingOptions) and the same op_id, in
// the same relative order as its other collectives on the mesh. op_id must be
// unique among the collectives in flight on the mesh at the same time (a
// group id combined with the group's sequence number, for instance); it is the
// hi half of every message tag the collective uses, so concurrent collectives
// (on one group or several) never see each other's messages.
//
// Determinism: every reduction computes element i as
//   ((x_0[i] op x_1[i]) op x_2[i]) ... op x_{n-1}[i]     (group-rank order)
// with reduce_range (accumulation in T, float for the 16-bit floats, rounded
// once; avg = sum / n), so results are bit-identical on every rank, for every
// chunk size and to the in-process algorithm. To get that order, the owner of
// segment s receives segment s of every rank's input (each rank sends its
// segment s straight to owner s, chunked and pipelined) and reduces all n
// contributions at once; the reduced segments then travel around the ring.
// Each rank sends and receives (n-1)/n of the data in each phase, as in a
// classic ring, but reduce-scatter traffic goes to every peer, not only to
// the next one.
//
// Threading and completion: the functions return at once; the work runs on
// the mesh's I/O thread (reductions too). done(nullptr) or done(error) is
// called exactly once, on the I/O thread, after every message the collective
// posted has completed: from then on the collective touches none of the
// caller's buffers, which must stay valid (and, for inputs, unchanged) until
// then. done must not block or throw.
//
// Errors: bad arguments throw synchronously (ValueError, DTypeError). Errors
// of the collective arrive in done, prefixed with the collective's name and
// this rank: PeerLostError "all_reduce (tcp) [rank 1]: connection to rank 3
// lost: ..." when a peer's connection fails, or "... rank 3 lost (reported by
// rank 2)" when the data this rank waited for could not be produced upstream.
// On failure the output buffers hold unspecified data. A failing collective
// still posts all of its messages (data it could not get is replaced by
// whatever its buffer holds and marked invalid through the message's aux
// word), so it completes on every rank, nothing hangs, and the connections
// between healthy ranks stay in step for later collectives. A peer that is
// alive but stuck makes the collective wait: bound it in the control plane and
// call TcpMesh::fail_peer() (or close()) to end it.
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <vector>

#include "dopt/actors/process_group.hpp"
#include "dopt/runtime/dtype.hpp"
#include "dopt/runtime/internal/tcp_transport.hpp"

namespace dopt::detail {

struct RingGroup {
  transport::TcpMesh* mesh = nullptr;  // not owned; outlives the collectives
  std::vector<int> ranks;              // global (mesh) ranks, group-rank order
  int me = -1;                         // this rank's index in ranks
};

struct RingOptions {
  /// all_reduce: the order in which the ranks' contributions are combined
  /// (kernels.hpp's reduce_members), and a division of each contribution
  /// before it (0: none). Must be the same on every rank.
  ReduceOrder order = ReduceOrder::rank;
  std::int64_t pre_divisor = 0;
  /// Bytes per message of the pipelined algorithms (rounded down to whole
  /// elements). Must be the same on every rank.
  std::size_t chunk_bytes = std::size_t(1) << 20;
  /// Buffers of at most this many bytes take the latency path: all_reduce and
  /// all_gather send the whole buffer to every peer (one hop), broadcast
  /// sends from the root to every peer.
  std::size_t small_bytes = std::size_t(64) << 10;
  /// all_reduce in a group of two: buffers of at most this many bytes take
  /// the latency path too. Between two ranks it moves the same bytes each
  /// way as the reduce-scatter and all-gather (the whole buffer), in one
  /// exchange instead of two dependent ones; the default covers buffers whose
  /// halves are one chunk each (no pipelining lost). Scratch: the buffer.
  std::size_t pair_bytes = std::size_t(2) << 20;
  /// Chunks of its own segment a reducing rank receives ahead (scratch =
  /// window * (n-1) * chunk_bytes, or the n-1 contributions of its whole
  /// segment when the window covers it). Messages that come earlier are
  /// buffered by the mesh.
  int window = 4;
  /// The reduce-scatter receives further ahead than `window` while its
  /// scratch stays within this many bytes (0: exactly `window`). A sender
  /// writes all of its chunks at once; those that arrive before their recv
  /// is posted are buffered by the mesh and copied again, so receiving
  /// ahead saves that copy and allocation (the buffering would have taken the
  /// memory anyway). Scratch pages are touched only as chunks arrive.
  std::size_t scratch_bytes = std::size_t(16) << 20;
};

using RingDone = std::function<void(std::exception_ptr)>;

/// buf (numel elements, in place) <- op over every member's buf.
void ring_all_reduce(const RingGroup& group, std::uint64_t op_id, void* buf, std::int64_t numel,
                     DType dtype, ReduceOp op, RingDone done, const RingOptions& options = {});

/// buf (numel elements) of member root (a group rank) <- op over every
/// member's buf, bit for bit what ring_all_reduce leaves there; the other
/// members' buf is only read (no copy of it is made). Small buffers go
/// whole to the root; large ones are reduce-scattered as in
/// ring_all_reduce, and each owner sends its reduced segment to the root.
/// Scratch: the root's as ring_all_reduce's; the others' is their share of
/// the reduce-scatter (at most RingOptions::scratch_bytes, or window chunks).
void ring_reduce(const RingGroup& group, std::uint64_t op_id, void* buf, std::int64_t numel, DType dtype,
                 ReduceOp op, int root, RingDone done, const RingOptions& options = {});

/// output (counts[me] elements) <- op over inputs[me] of every member.
/// inputs[s] (counts[s] elements) is this rank's contribution to member s's
/// segment; counts must be the same on every rank. output may alias inputs[me].
void ring_reduce_scatter(const RingGroup& group, std::uint64_t op_id,
                         const std::vector<const void*>& inputs,
                         const std::vector<std::int64_t>& counts, void* output, DType dtype,
                         ReduceOp op, RingDone done, const RingOptions& options = {});

/// outputs[s] (bytes each) <- input of member s. input may alias outputs[me].
void ring_all_gather(const RingGroup& group, std::uint64_t op_id, const void* input,
                     std::size_t bytes, const std::vector<void*>& outputs, RingDone done,
                     const RingOptions& options = {});
/// Flat form: output holds size * bytes, member s's input at s * bytes.
void ring_all_gather(const RingGroup& group, std::uint64_t op_id, const void* input,
                     std::size_t bytes, void* output, RingDone done,
                     const RingOptions& options = {});

/// buf (bytes) on every member <- buf of member root (a group rank). Large
/// buffers go down a pipelined chain root -> root+1 -> ... (ring order).
void ring_broadcast(const RingGroup& group, std::uint64_t op_id, void* buf, std::size_t bytes,
                    int root, RingDone done, const RingOptions& options = {});

}  // namespace dopt::detail
