#pragma once
// What one rank asked of a group: the call's descriptor (which every member
// must agree on) and the call itself, as the planes receive it.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dopt/actors/future.hpp"
#include "dopt/actors/process_group.hpp"
#include "dopt/runtime/tensor.hpp"

namespace dopt::detail {

enum class CollKind : std::uint8_t {
  broadcast,
  all_reduce,
  reduce,
  all_gather,
  all_gather_flat,
  reduce_scatter,
  barrier,
  new_group,
  send,
  recv,
  all_reduce_coalesced,
  broadcast_coalesced,
};
const char* coll_name(CollKind k) noexcept;

/// What a rank asked for; ranks of one (group, seq) must agree on all of it
/// but `caller`.
struct CollDesc {
  CollKind kind = CollKind::barrier;
  ReduceOp op = ReduceOp::sum;
  DType dtype = DType::float32;
  Shape shape;             // of the matched tensor (input; output for reduce_scatter; [total] when coalesced)
  int root = -1;           // group rank: src / dst
  std::string extra;       // new_group: the member list; coalesced: the tensors' shapes
  ReduceOrder order = ReduceOrder::rank;
  std::int64_t pre_divisor = 0;  // > 0: inputs divided by it before the reduction
  /// The public call that issued it (call_label.hpp), what errors name first.
  /// Not compared: ranks may reach one collective through different calls
  /// (Join's shadow collectives), and the planes report it on a mismatch.
  std::string caller;
  bool operator==(const CollDesc& o) const {
    return kind == o.kind && op == o.op && dtype == o.dtype && shape == o.shape && root == o.root &&
           extra == o.extra && order == o.order && pre_divisor == o.pre_divisor;
  }
  /// "all_reduce(sum, float32, [4])"
  std::string str() const;
  bool has_op() const {
    return kind == CollKind::all_reduce || kind == CollKind::reduce || kind == CollKind::reduce_scatter ||
           kind == CollKind::all_reduce_coalesced;
  }
  bool has_tensor() const { return kind != CollKind::barrier && kind != CollKind::new_group; }
  /// The operation errors of this call name: the caller, else the collective.
  const char* who() const { return caller.empty() ? coll_name(kind) : caller.c_str(); }
};

/// A group that a new_group call creates (its members, ascending global ranks).
struct GroupSpec {
  std::uint64_t gid = 0;
  std::vector<int> members;
};

/// One call of one rank.
/// tensors, by kind:
///   broadcast, all_reduce, reduce: [t]
///   all_gather:       [input, out_0, ..., out_{n-1}]
///   all_gather_flat:  [input, output]
///   reduce_scatter:   [output, in_0, ..., in_{n-1}]
///   send / recv:      [t]
///   *_coalesced:      the tensors, one flat buffer in this order
struct Op {
  std::uint64_t gid = 0;
  std::uint64_t seq = 0;  // group sequence number; for send/recv the per-(peer, tag) one
  std::shared_ptr<const std::vector<int>> members;  // global ranks, ascending
  int my_grank = 0;                                 // this rank in the group
  CollDesc desc;
  std::vector<Tensor> tensors;
  std::chrono::milliseconds timeout{0};
  int peer = -1;  // send/recv: global rank of the other side
  int tag = 0;
  std::vector<GroupSpec> creates;  // new_group: the groups this call makes
  Promise<void> promise;
};
using OpPtr = std::shared_ptr<Op>;

/// Tag hi word of a collective's messages on the TCP mesh: unique among the
/// calls in flight, the same on every rank. (p2p messages set the top bit,
/// the hierarchical plane bit 62.)
inline std::uint64_t mesh_op_id(std::uint64_t gid, std::uint64_t seq) {
  std::uint64_t x = gid * 0x9E3779B97F4A7C15ULL + seq;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ULL;
  x ^= x >> 29;
  return x & ~(std::uint64_t{1} << 63) & ~(std::uint64_t{1} << 62);
}

}  // namespace dopt::detail
