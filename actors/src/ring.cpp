#include "ring.hpp"

#include <algorithm>
#include <cstring>
#include <memory>
#include <set>
#include <string>

#include "dopt/runtime/error.hpp"
#include "kernels.hpp"

namespace dopt::detail {
namespace {

using transport::Tag;
using transport::TcpMesh;

// Message streams of one collective (the lo half of the tag: phase << 32 | segment).
enum Phase : std::uint64_t { k_rs = 1, k_ag = 2, k_small = 3, k_bcast = 4 };
Tag tag_of(std::uint64_t op_id, Phase phase, std::uint64_t segment) {
  return Tag{op_id, (std::uint64_t(phase) << 32) | segment};
}

// aux word of a message: 0 = valid data; r + 1 = invalid because global rank r
// was lost; k_failed_other = invalid for another reason.
constexpr std::uint32_t k_failed_other = 0xFFFFFFFFu;

struct Buffer {
  std::unique_ptr<std::byte[]> data;
  explicit Buffer(std::size_t n = 0) : data(n ? new std::byte[n] : nullptr) {}
  std::byte* get() const { return data.get(); }
};

std::size_t chunks(std::int64_t count, std::int64_t per) {
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
    ++pending_;
    auto self = shared_from_this();
    mesh_.send(ranks_[g], t, p, bytes,
               [self, g](std::exception_ptr e) {
                 if (e) self->failed(e, g, 0);
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

// --- reduce-scatter (+ all-gather for all_reduce) -------------------------------------
//
// Owner of segment s receives segment s of every input, reduces chunk c once all
// n contributions of chunk c are there, in group-rank order. With all_gather, the
// reduced chunk goes to the next rank and travels around the ring.
class ReduceScatterOp : public RingOp {
 public:
  ReduceScatterOp(const RingGroup& g, std::uint64_t id, std::string name, RingDone done,
                  const RingOptions& opt, std::vector<const void*> inputs,
                  std::vector<std::int64_t> counts, void* output, DType dtype, ReduceOp op,
                  bool all_gather, std::vector<void*> segments)
      : RingOp(g, id, std::move(name), std::move(done), opt),
        inputs_(std::move(inputs)),
        counts_(std::move(counts)),
        output_(static_cast<std::byte*>(output)),
        dtype_(dtype),
        op_(op),
        isz_(itemsize(dtype)),
        ce_(std::max<std::int64_t>(1, std::int64_t(opt.chunk_bytes / itemsize(dtype)))),
        all_gather_(all_gather),
        segments_(std::move(segments)) {}

 protected:
  void start() override {
    if (n_ == 1) {
      reduce_range(op_, dtype_, {inputs_[0]}, {output_}, 0, counts_[0]);
      return;
    }
    // 1. My contribution to every other segment, straight to its owner.
    for (int s = 0; s < n_; ++s) {
      if (s == me_) continue;
      const auto* in = static_cast<const std::byte*>(inputs_[s]);
      for (std::size_t c = 0; c < chunks(counts_[s], ce_); ++c)
        send(s, tag(k_rs, 0), in + c * ce_ * isz_, len(s, c) * isz_, 0);
    }
    // 2. The other contributions to my segment, `window` chunks ahead.
    nc_ = chunks(counts_[me_], ce_);
    if (nc_ > 0) {
      w_ = std::min<std::size_t>(std::size_t(opt_.window), nc_);
      slot_elems_ = std::min<std::int64_t>(ce_, counts_[me_]);
      scratch_ = Buffer(w_ * std::size_t(n_ - 1) * slot_elems_ * isz_);
      arrived_.assign(nc_, 0);
      code_.assign(nc_, 0);
      for (std::size_t c = 0; c < w_; ++c) post_chunk(c);
    }
    // 3. All-gather: receive every other reduced segment from the previous rank.
    if (all_gather_) {
      for (int s = 0; s < n_; ++s) {
        if (s == me_) continue;
        auto* seg = static_cast<std::byte*>(segments_[s]);
        for (std::size_t c = 0; c < chunks(counts_[s], ce_); ++c) {
          std::byte* p = seg + c * ce_ * isz_;
          const std::size_t bytes = len(s, c) * isz_;
          recv(prev(), tag(k_ag, std::uint64_t(s)), p, bytes, [this, s, p, bytes](std::uint32_t code) {
            if (next() != s) send(next(), tag(k_ag, std::uint64_t(s)), p, bytes, code);
          });
        }
      }
    }
  }

 private:
  std::size_t len(int s, std::size_t c) const {
    return std::size_t(std::min<std::int64_t>(ce_, counts_[s] - std::int64_t(c) * ce_));
  }
  std::byte* slot(std::size_t c, int peer_index) const {
    return scratch_.get() + ((c % w_) * std::size_t(n_ - 1) + std::size_t(peer_index)) * slot_elems_ * isz_;
  }
  static int peer_index(int me, int s) { return s < me ? s : s - 1; }

  void post_chunk(std::size_t c) {
    for (int s = 0; s < n_; ++s) {
      if (s == me_) continue;
      recv(s, tag(k_rs, 0), slot(c, peer_index(me_, s)), len(me_, c) * isz_, [this, c](std::uint32_t code) {
        if (code != 0 && code_[c] == 0) code_[c] = code;
        ++arrived_[c];
        advance();
      });
    }
  }

  void advance() {
    while (next_ < nc_ && arrived_[next_] == n_ - 1) {
      const std::size_t c = next_++;
      reduce_chunk(c);
      if (c + w_ < nc_) post_chunk(c + w_);
    }
  }

  void reduce_chunk(std::size_t c) {
    const std::size_t off = c * std::size_t(ce_) * isz_;
    std::byte* out = output_ + off;
    if (code_[c] == 0) {
      std::vector<const void*> ins(static_cast<std::size_t>(n_));
      for (int k = 0; k < n_; ++k)
        ins[k] = k == me_ ? static_cast<const std::byte*>(inputs_[me_]) + off : slot(c, peer_index(me_, k));
      reduce_range(op_, dtype_, ins, {out}, 0, std::int64_t(len(me_, c)));
    }
    if (all_gather_) send(next(), tag(k_ag, std::uint64_t(me_)), out, len(me_, c) * isz_, code_[c]);
  }

  std::vector<const void*> inputs_;
  std::vector<std::int64_t> counts_;
  std::byte* output_;
  DType dtype_;
  ReduceOp op_;
  std::size_t isz_;
  std::int64_t ce_;
  bool all_gather_;
  std::vector<void*> segments_;
  std::size_t nc_ = 0, w_ = 0, next_ = 0;
  std::int64_t slot_elems_ = 0;
  Buffer scratch_;
  std::vector<int> arrived_;
  std::vector<std::uint32_t> code_;
};

// --- small all_reduce: every buffer to every rank, reduce locally in rank order -------
class SmallAllReduceOp : public RingOp {
 public:
  SmallAllReduceOp(const RingGroup& g, std::uint64_t id, std::string name, RingDone done,
                   const RingOptions& opt, void* buf, std::int64_t numel, DType dtype, ReduceOp op)
      : RingOp(g, id, std::move(name), std::move(done), opt),
        buf_(static_cast<std::byte*>(buf)),
        numel_(numel),
        dtype_(dtype),
        op_(op),
        bytes_(std::size_t(numel) * itemsize(dtype)),
        scratch_(std::size_t(n_ - 1) * bytes_) {}

 protected:
  void start() override {
    for (int s = 0; s < n_; ++s) {
      if (s == me_) continue;
      send(s, tag(k_small, 0), buf_, bytes_, 0);
      recv(s, tag(k_small, 0), slot(s), bytes_, [](std::uint32_t) {});
    }
  }
  void on_complete() override {  // every send is out: buf may be overwritten
    std::vector<const void*> ins(static_cast<std::size_t>(n_));
    for (int k = 0; k < n_; ++k) ins[k] = k == me_ ? static_cast<const void*>(buf_) : slot(k);
    reduce_range(op_, dtype_, ins, {buf_}, 0, numel_);
  }

 private:
  std::byte* slot(int s) const { return scratch_.get() + std::size_t(s < me_ ? s : s - 1) * bytes_; }
  std::byte* buf_;
  std::int64_t numel_;
  DType dtype_;
  ReduceOp op_;
  std::size_t bytes_;
  Buffer scratch_;
};

// --- all_gather ------------------------------------------------------------------------
class AllGatherOp : public RingOp {
 public:
  AllGatherOp(const RingGroup& g, std::uint64_t id, std::string name, RingDone done,
              const RingOptions& opt, const void* input, std::size_t bytes, std::vector<void*> outputs)
      : RingOp(g, id, std::move(name), std::move(done), opt),
        input_(input),
        bytes_(bytes),
        outputs_(std::move(outputs)) {}

 protected:
  void start() override {
    if (outputs_[me_] != input_ && bytes_ > 0) std::memmove(outputs_[me_], input_, bytes_);
    if (bytes_ == 0 || n_ == 1) return;
    if (bytes_ <= opt_.small_bytes) {
      for (int s = 0; s < n_; ++s) {
        if (s == me_) continue;
        send(s, tag(k_small, 0), input_, bytes_, 0);
        recv(s, tag(k_small, 0), outputs_[s], bytes_, [](std::uint32_t) {});
      }
      return;
    }
    const std::size_t ce = std::max<std::size_t>(1, opt_.chunk_bytes);
    const std::size_t nc = (bytes_ + ce - 1) / ce;
    for (int s = 0; s < n_; ++s) {
      auto* seg = static_cast<std::byte*>(outputs_[s]);
      for (std::size_t c = 0; c < nc; ++c) {
        std::byte* p = seg + c * ce;
        const std::size_t b = std::min(ce, bytes_ - c * ce);
        const Tag t = tag(k_ag, std::uint64_t(s));
        if (s == me_) {
          send(next(), t, p, b, 0);
        } else {
          recv(prev(), t, p, b, [this, s, t, p, b](std::uint32_t code) {
            if (next() != s) send(next(), t, p, b, code);
          });
        }
      }
    }
  }

 private:
  const void* input_;
  std::size_t bytes_;
  std::vector<void*> outputs_;
};

// --- broadcast ---------------------------------------------------------------------------
class BroadcastOp : public RingOp {
 public:
  BroadcastOp(const RingGroup& g, std::uint64_t id, std::string name, RingDone done,
              const RingOptions& opt, void* buf, std::size_t bytes, int root)
      : RingOp(g, id, std::move(name), std::move(done), opt),
        buf_(static_cast<std::byte*>(buf)),
        bytes_(bytes),
        root_(root) {}

 protected:
  void start() override {
    if (bytes_ == 0 || n_ == 1) return;
    const Tag t = tag(k_bcast, 0);
    if (bytes_ <= opt_.small_bytes) {
      if (me_ == root_) {
        for (int s = 0; s < n_; ++s)
          if (s != me_) send(s, t, buf_, bytes_, 0);
      } else {
        recv(root_, t, buf_, bytes_, [](std::uint32_t) {});
      }
      return;
    }
    const std::size_t ce = std::max<std::size_t>(1, opt_.chunk_bytes);
    const std::size_t nc = (bytes_ + ce - 1) / ce;
    for (std::size_t c = 0; c < nc; ++c) {
      std::byte* p = buf_ + c * ce;
      const std::size_t b = std::min(ce, bytes_ - c * ce);
      if (me_ == root_) {
        send(next(), t, p, b, 0);
      } else {
        recv(prev(), t, p, b, [this, t, p, b](std::uint32_t code) {
          if (next() != root_) send(next(), t, p, b, code);
        });
      }
    }
  }

 private:
  std::byte* buf_;
  std::size_t bytes_;
  int root_;
};

// --- argument checks -----------------------------------------------------------------------
void check_group(const RingGroup& g, const std::string& name, const RingDone& done,
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

void check_reduction(DType dtype, ReduceOp op, const std::string& name, int rank) {
  if (dtype == DType::bool_) throw DTypeError(name, "bool tensors cannot be reduced", rank);
  if (op == ReduceOp::avg && !is_floating_point(dtype))
    throw DTypeError(name, "ReduceOp avg needs a floating point dtype, got " +
                               std::string(dtype_name(dtype)), rank);
}

template <class Op, class... Args>
void run(const RingGroup& g, Args&&... args) {
  std::make_shared<Op>(g, std::forward<Args>(args)...)->launch();
}

}  // namespace

void ring_all_reduce(const RingGroup& g, std::uint64_t op_id, void* buf, std::int64_t numel,
                     DType dtype, ReduceOp op, RingDone done, const RingOptions& opt) {
  const std::string name = "all_reduce (tcp)";
  check_group(g, name, done, opt);
  check_reduction(dtype, op, name, g.mesh->rank());
  if (numel < 0) throw ValueError(name, "negative numel", g.mesh->rank());
  if (numel > 0 && !buf) throw ValueError(name, "null buffer", g.mesh->rank());
  const int n = int(g.ranks.size());
  const std::size_t bytes = std::size_t(numel) * itemsize(dtype);
  if (n == 1 || numel == 0) {
    // Nothing to exchange; avg of one rank is x / 1 (bit-identical to x).
    if (op == ReduceOp::avg && numel > 0)
      reduce_range(op, dtype, {buf}, {buf}, 0, numel);
    g.mesh->post([done = std::move(done)] { done(nullptr); });
    return;
  }
  if (bytes <= opt.small_bytes) {
    run<SmallAllReduceOp>(g, op_id, name, std::move(done), opt, buf, numel, dtype, op);
    return;
  }
  // Segment s = [s*numel/n, (s+1)*numel/n), like the in-process algorithm.
  std::vector<const void*> inputs(n);
  std::vector<void*> segments(n);
  std::vector<std::int64_t> counts(n);
  auto* base = static_cast<std::byte*>(buf);
  for (int s = 0; s < n; ++s) {
    const std::int64_t lo = std::int64_t(s) * numel / n, hi = std::int64_t(s + 1) * numel / n;
    counts[s] = hi - lo;
    segments[s] = base + std::size_t(lo) * itemsize(dtype);
    inputs[s] = segments[s];
  }
  void* out = segments[g.me];
  run<ReduceScatterOp>(g, op_id, name, std::move(done), opt, std::move(inputs), std::move(counts), out,
                       dtype, op, true, std::move(segments));
}

void ring_reduce_scatter(const RingGroup& g, std::uint64_t op_id,
                         const std::vector<const void*>& inputs,
                         const std::vector<std::int64_t>& counts, void* output, DType dtype,
                         ReduceOp op, RingDone done, const RingOptions& opt) {
  const std::string name = "reduce_scatter (tcp)";
  check_group(g, name, done, opt);
  const int rank = g.mesh->rank();
  check_reduction(dtype, op, name, rank);
  const int n = int(g.ranks.size());
  if (int(inputs.size()) != n || int(counts.size()) != n)
    throw ValueError(name, "expected " + std::to_string(n) + " inputs and counts, got " +
                               std::to_string(inputs.size()) + " and " + std::to_string(counts.size()),
                     rank);
  for (int s = 0; s < n; ++s) {
    if (counts[s] < 0) throw ValueError(name, "negative count for group rank " + std::to_string(s), rank);
    if (counts[s] > 0 && !inputs[s])
      throw ValueError(name, "null input for group rank " + std::to_string(s), rank);
  }
  if (counts[g.me] > 0 && !output) throw ValueError(name, "null output", rank);
  run<ReduceScatterOp>(g, op_id, name, std::move(done), opt, inputs, counts, output, dtype, op, false,
                       std::vector<void*>{});
}

void ring_all_gather(const RingGroup& g, std::uint64_t op_id, const void* input, std::size_t bytes,
                     const std::vector<void*>& outputs, RingDone done, const RingOptions& opt) {
  const std::string name = "all_gather (tcp)";
  check_group(g, name, done, opt);
  const int rank = g.mesh->rank();
  if (outputs.size() != g.ranks.size())
    throw ValueError(name, "expected " + std::to_string(g.ranks.size()) + " outputs, got " +
                               std::to_string(outputs.size()), rank);
  if (bytes > 0) {
    if (!input) throw ValueError(name, "null input", rank);
    for (void* p : outputs)
      if (!p) throw ValueError(name, "null output", rank);
  }
  run<AllGatherOp>(g, op_id, name, std::move(done), opt, input, bytes, outputs);
}

void ring_all_gather(const RingGroup& g, std::uint64_t op_id, const void* input, std::size_t bytes,
                     void* output, RingDone done, const RingOptions& opt) {
  std::vector<void*> outputs(g.ranks.size());
  for (std::size_t s = 0; s < outputs.size(); ++s)
    outputs[s] = output ? static_cast<std::byte*>(output) + s * bytes : nullptr;
  ring_all_gather(g, op_id, input, bytes, outputs, std::move(done), opt);
}

void ring_broadcast(const RingGroup& g, std::uint64_t op_id, void* buf, std::size_t bytes, int root,
                    RingDone done, const RingOptions& opt) {
  const std::string name = "broadcast (tcp)";
  check_group(g, name, done, opt);
  const int rank = g.mesh->rank();
  if (root < 0 || root >= int(g.ranks.size()))
    throw ValueError(name, "root " + std::to_string(root) + " is outside a group of " +
                               std::to_string(g.ranks.size()), rank);
  if (bytes > 0 && !buf) throw ValueError(name, "null buffer", rank);
  run<BroadcastOp>(g, op_id, name, std::move(done), opt, buf, bytes, root);
}

}  // namespace dopt::detail
