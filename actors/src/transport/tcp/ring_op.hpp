#pragma once
// What the ring collectives share: the message tags of a collective, the
// base class that counts its messages and turns failures into errors, the
// argument checks. Internal to transport/tcp.
#include <algorithm>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "dopt/runtime/error.hpp"
#include "plane/kernels.hpp"
#include "dopt/actors/internal/ring.hpp"

namespace dopt::detail::ring {


using transport::Tag;
using transport::TcpMesh;

// Message streams of one collective (the lo half of the tag: phase << 32 | segment).
enum Phase : std::uint64_t { k_rs = 1, k_ag = 2, k_small = 3, k_bcast = 4, k_root = 5 };
inline Tag tag_of(std::uint64_t op_id, Phase phase, std::uint64_t segment) {
  return Tag{op_id, (std::uint64_t(phase) << 32) | segment};
}

// aux word of a message: 0 = valid data; r + 1 = invalid because global rank r
// was lost; k_failed_other = invalid for another reason.
constexpr std::uint32_t k_failed_other = 0xFFFFFFFFu;

// A collective's scratch, from the mesh's pool (memory used before: a fresh
// buffer per call faulted in every page, which cost more than the transfer).
struct Buffer {
  BufferPool::Lease data;
  Buffer() = default;
  Buffer(TcpMesh& mesh, std::size_t n) : data(mesh.buffers().take(n)) {}
  std::byte* get() const { return data.get(); }
};

inline std::size_t chunks(std::int64_t count, std::int64_t per) {
  return count <= 0 ? 0 : std::size_t((count + per - 1) / per);
}

class RingOp : public std::enable_shared_from_this<RingOp> {
 public:
  RingOp(const RingGroup& g, std::uint64_t op_id, std::string name, RingDone done,
         const RingOptions& opt)
      : mesh_(*g.mesh),
        ranks_(g.ranks),
        me_(g.me),
        n_(int(g.ranks.size())),
        op_id_(op_id),
        name_(std::move(name)),
        done_(std::move(done)),
        opt_(opt) {}
  virtual ~RingOp() = default;

  void launch() {
    auto self = shared_from_this();
    mesh_.post([self] {
      ++self->pending_;
      self->start();
      self->release();
    });
  }

 protected:
  virtual void start() = 0;
  /// Runs once every message has completed, before done (when no error).
  virtual void on_complete() {}

  int next() const { return (me_ + 1) % n_; }
  int prev() const { return (me_ + n_ - 1) % n_; }
  Tag tag(Phase p, std::uint64_t seg) const { return tag_of(op_id_, p, seg); }

  void send(int g, Tag t, const void* p, std::size_t bytes, std::uint32_t aux) {
    send(g, t, p, bytes, aux, [] {});
  }

  /// The same; then() runs once the send completed (after a failure too).
  template <class Then>
  void send(int g, Tag t, const void* p, std::size_t bytes, std::uint32_t aux, Then then) {
    ++pending_;
    auto self = shared_from_this();
    mesh_.send(ranks_[g], t, p, bytes,
               [self, g, then = std::move(then)](std::exception_ptr e) mutable {
                 if (e) self->failed(e, g, 0);
                 then();
                 self->release();
               },
               aux);
  }

  /// then(code): code 0 when the data is valid.
  template <class Then>
  void recv(int g, Tag t, void* p, std::size_t bytes, Then then) {
    ++pending_;
    auto self = shared_from_this();
    auto aux = std::make_shared<std::uint32_t>(0);
    mesh_.recv(ranks_[g], t, p, bytes,
               [self, g, aux, then = std::move(then)](std::exception_ptr e) mutable {
                 const std::uint32_t code = self->failed(e, g, e ? 0 : *aux);
                 then(code);
                 self->release();
               },
               aux.get());
  }

  /// Records a failure of a message with group rank g (error e, or an invalid
  /// message marked aux); returns the aux code data derived from it carries.
  std::uint32_t failed(const std::exception_ptr& e, int g, std::uint32_t aux) {
    if (!e && aux == 0) return 0;
    std::uint32_t code = aux;
    std::exception_ptr mine;
    const int rank = mesh_.rank();
    if (e) {
      try {
        std::rethrow_exception(e);
      } catch (const PeerLostError& x) {
        code = std::uint32_t(ranks_[g]) + 1;
        mine = std::make_exception_ptr(PeerLostError(name_, x.detail(), rank));
      } catch (const CollectiveMismatchError& x) {
        code = k_failed_other;
        mine = std::make_exception_ptr(CollectiveMismatchError(name_, x.detail(), rank));
      } catch (const StateError& x) {
        code = k_failed_other;
        mine = std::make_exception_ptr(StateError(name_, x.detail(), rank));
      } catch (const Error& x) {
        code = k_failed_other;
        mine = std::make_exception_ptr(Error(name_, x.detail(), rank));
      } catch (const std::exception& x) {
        code = k_failed_other;
        mine = std::make_exception_ptr(Error(name_, x.what(), rank));
      }
    } else if (aux == k_failed_other) {
      mine = std::make_exception_ptr(
          Error(name_, "rank " + std::to_string(ranks_[g]) + " sent data it could not produce", rank));
    } else {
      mine = std::make_exception_ptr(PeerLostError(
          name_, "rank " + std::to_string(aux - 1) + " lost (reported by rank " +
                     std::to_string(ranks_[g]) + ")",
          rank));
    }
    if (!error_) error_ = mine;
    return code;
  }

  void release() {
    if (--pending_ > 0) return;
    if (!error_) {
      try {
        on_complete();
      } catch (...) {
        error_ = std::current_exception();
      }
    }
    RingDone d = std::move(done_);
    d(error_);
  }

  TcpMesh& mesh_;
  std::vector<int> ranks_;
  int me_;
  int n_;
  std::uint64_t op_id_;
  std::string name_;
  RingDone done_;
  RingOptions opt_;
  std::exception_ptr error_;
  std::int64_t pending_ = 0;
};


// --- argument checks -----------------------------------------------------------------------
inline void check_group(const RingGroup& g, const std::string& name, const RingDone& done,
                 const RingOptions& opt) {
  if (!g.mesh) throw ValueError(name, "the group has no mesh");
  const int rank = g.mesh->rank();
  if (g.ranks.empty()) throw ValueError(name, "the group has no ranks", rank);
  if (g.me < 0 || g.me >= int(g.ranks.size()))
    throw ValueError(name, "group index " + std::to_string(g.me) + " is outside a group of " +
                               std::to_string(g.ranks.size()), rank);
  std::set<int> seen;
  for (int r : g.ranks) {
    if (r < 0 || r >= g.mesh->world_size())
      throw ValueError(name, "group rank list holds " + std::to_string(r) + ", outside the mesh's world of " +
                                 std::to_string(g.mesh->world_size()), rank);
    if (!seen.insert(r).second)
      throw ValueError(name, "group rank list holds " + std::to_string(r) + " twice", rank);
  }
  if (g.ranks[g.me] != rank)
    throw ValueError(name, "group index " + std::to_string(g.me) + " is rank " +
                               std::to_string(g.ranks[g.me]) + ", not this mesh's rank", rank);
  if (!done) throw ValueError(name, "no completion callback", rank);
  if (opt.chunk_bytes == 0) throw ValueError(name, "chunk_bytes must be positive", rank);
  if (opt.window < 1) throw ValueError(name, "window must be at least 1", rank);
}

inline void check_reduction(DType dtype, ReduceOp op, const std::string& name, int rank) {
  if (dtype == DType::bool_) throw DTypeError(name, "bool tensors cannot be reduced", rank);
  if (op == ReduceOp::avg && !is_floating_point(dtype))
    throw DTypeError(name, "ReduceOp avg needs a floating point dtype, got " +
                               std::string(dtype_name(dtype)), rank);
}

template <class Op, class... Args>
void run(const RingGroup& g, Args&&... args) {
  std::make_shared<Op>(g, std::forward<Args>(args)...)->launch();
}

/// ring_all_reduce's latency path (every member's whole buffer to every
/// peer, reduced in place in rank order); with root >= 0 (ring_reduce) only
/// the root receives and reduces, the others only send to it.
void launch_small_all_reduce(const RingGroup& g, std::uint64_t op_id, std::string name, RingDone done,
                             const RingOptions& opt, void* buf, std::int64_t numel, DType dtype, ReduceOp op,
                             int root);

/// What the reduce-scatter does with the reduced segments after it.
struct AfterScatter {
  enum Kind { none, all_gather, to_root };
  Kind kind = none;
  /// to_root: the group rank that receives every reduced segment.
  int root = -1;
  /// all_gather, and to_root on the root: where segment s goes (the
  /// whole buffer's segment s). Empty on the other ranks of to_root.
  std::vector<void*> segments;
};

/// The reduce-scatter of ring_reduce_scatter, of ring_all_reduce (which then
/// all-gathers the reduced segments) and of ring_reduce (which sends them to
/// the root). With all_gather and to_root, inputs[s] are the segments of one
/// whole buffer (the reduction order needs their place in it); output is
/// this rank's own segment, or null on a rank other than to_root's root (the
/// reduced chunk is then written over a chunk of scratch and sent from there).
void launch_reduce_scatter(const RingGroup& g, std::uint64_t op_id, std::string name, RingDone done,
                           const RingOptions& opt, std::vector<const void*> inputs, std::vector<std::int64_t> counts,
                           void* output, DType dtype, ReduceOp op, AfterScatter after);

}  // namespace dopt::detail::ring
