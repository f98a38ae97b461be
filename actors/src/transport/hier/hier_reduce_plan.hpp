#pragma once
// How the hierarchical all_reduce cuts a member's slice of a chunk into the
// messages its chain of hosts passes: runs of at most 256 KiB of
// accumulator, each with its reduction order cut into pieces of ranks on one
// host. Both ways of the all_reduce (staged, cross-memory) send exactly these
// messages, so hosts that take different ways still meet.
#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "plane/kernels.hpp"
#include "transport/hier/hier_group.hpp"

namespace dopt::detail::hier {

/// What both ways of the all_reduce cut a buffer of `bytes` by.
struct ReduceGeometry {
  std::int64_t es;     // bytes per element
  std::size_t aes;     // bytes per accumulator element
  std::int64_t total;  // elements
  std::int64_t per;    // elements per chunk (the shared-memory buffer's size)
  ReduceSpec spec;
  ReduceGeometry(const Op& call, std::size_t bytes, std::size_t buf_bytes, DType dtype, ReduceOp op)
      : es(static_cast<std::int64_t>(itemsize(dtype))),
        aes(acc_itemsize(dtype)),
        total(static_cast<std::int64_t>(bytes) / es),
        per(std::max<std::int64_t>(1, static_cast<std::int64_t>(buf_bytes) / es)),
        spec{op, dtype, call.desc.order, call.desc.pre_divisor, total} {}
};

/// A run's order cut into pieces of ranks on one host: (host, group ranks).
using Pieces = std::vector<std::pair<int, std::vector<int>>>;

struct SlicePlan {
  std::vector<RankRun> runs;
  std::vector<Pieces> cut;          // per run
  std::vector<std::size_t> acc_at;  // run r's accumulator at acc_at[r] of the scratch; acc_at.back(): all
};

/// Elements [lo, hi) (this member's slice of a chunk).
inline SlicePlan plan_slice(const Topology& t, const ReduceSpec& spec, std::int64_t lo, std::int64_t hi,
                            std::size_t aes) {
  SlicePlan p;
  const int n = static_cast<int>(t.members.size());
  if (hi > lo) {
    const std::int64_t sub = std::max<std::int64_t>(1, static_cast<std::int64_t>((256u << 10) / aes));
    for (auto& whole : reduction_order(spec, n, lo, hi - lo))
      for (std::int64_t a = 0; a < whole.count; a += sub)
        p.runs.push_back(RankRun{whole.lo + a, std::min(sub, whole.count - a), whole.order});
  }
  p.cut.resize(p.runs.size());
  p.acc_at.assign(p.runs.size() + 1, 0);
  for (std::size_t r = 0; r < p.runs.size(); ++r) {
    for (int gr : p.runs[r].order) {
      const int h = t.host_of[static_cast<std::size_t>(gr)];
      if (p.cut[r].empty() || p.cut[r].back().first != h) p.cut[r].push_back({h, {}});
      p.cut[r].back().second.push_back(gr);
    }
    p.acc_at[r + 1] = p.acc_at[r] + static_cast<std::size_t>(p.runs[r].count) * aes;
  }
  // The tags (chain_tag) have 12 bits for the run and 8 for the piece.
  std::size_t most_pieces = 0;
  for (const auto& pieces : p.cut) most_pieces = std::max(most_pieces, pieces.size());
  if (p.runs.size() >= 4096 || most_pieces >= 256)
    throw StateError("hier", "a chunk's slice cuts into " + std::to_string(p.runs.size()) + " runs of up to " +
                                 std::to_string(most_pieces) +
                                 " pieces; the hierarchical all_reduce takes fewer than 4096 and 256 (a smaller "
                                 "DOPT_SHM_BUFFER_BYTES, or fewer hosts)");
  return p;
}

/// The mesh tags of a run's messages: the accumulator into piece p, the result.
inline transport::Tag chain_tag(const HierGroup& g, const HierCall& c, std::uint64_t chunk, std::size_t r,
                                std::size_t p) {
  return g.tag(c, HierGroup::kChain, chunk, (r << 8) | p);
}
inline transport::Tag result_tag(const HierGroup& g, const HierCall& c, std::uint64_t chunk, std::size_t r) {
  return g.tag(c, HierGroup::kResult, chunk, r);
}

}  // namespace dopt::detail::hier

namespace dopt::detail::shm_plane {
class FlatView;
}

namespace dopt::detail::hier {

/// The all_reduce of `v` on the hierarchical plane with several members per
/// host (every member passes the same layout), through the members'
/// shared-memory buffers in rounds of chunks. `matched`: the call's first
/// round is already done and matched (cross_memory_all_reduce gave up).
void staged_all_reduce(HierGroup& g, HierCall& c, const shm_plane::FlatView& v, DType dtype, ReduceOp op,
                       bool matched);

/// The same for `tensors` (seen as one buffer), where the host's members
/// are processes that can read each other's memory and the tensors are one
/// range of at least 4 MiB: no staging, no rounds per chunk
/// (hier_all_reduce_cma.cpp). Returns false, having done nothing else, where
/// it cannot; `matched` then tells whether it ran the call's first round and
/// match (it decides after them: every member of the host must take the same
/// way).
bool cross_memory_all_reduce(HierGroup& g, HierCall& c, const std::vector<Tensor>& tensors, DType dtype,
                             ReduceOp op, bool& matched);

}  // namespace dopt::detail::hier
