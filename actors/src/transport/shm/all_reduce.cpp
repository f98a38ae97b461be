// all_reduce (and all_reduce_coalesced: the tensors form one flat buffer,
// never copied into one) and reduce on the shared-memory plane: one set of
// algorithms, where the result goes to every member (all_reduce, root -1) or
// to the root only (reduce).
#include <algorithm>
#include <vector>

#include "plane/kernels.hpp"
#include "plane/shm_one_round.hpp"
#include "transport/shm/algorithms.hpp"
#include "transport/shm/flat_view.hpp"

namespace dopt::detail::shm_plane {

namespace {

/// Whether the one-round way fits: the data fits a buffer, and what each
/// receiver then reduces (every member's data, members x bytes) stays within
/// kOneRoundSmallCalls (plane/shm_one_round.hpp) small calls' worth
/// (processes), one small call's worth (threads: every member's reduction
/// runs on the cores of one process, thousands of them on one when
/// simulated); past it each member reduces a slice instead (O(bytes) per
/// member, not O(members x bytes)). Every member sees the same size and
/// group: they agree.
bool small_fits(const Channel& ch, std::size_t bytes) {
  const std::size_t most = ch.in_process() ? ch.small_bytes() : kOneRoundSmallCalls * ch.small_bytes();
  return bytes <= ch.small_bytes() && bytes <= ch.buf_bytes() && bytes * static_cast<std::size_t>(ch.size()) <= most;
}

/// Whether this member receives the result.
bool receives(int me, int root) { return root < 0 || me == root; }

/// One round: every member stages all of its data; each receiver reduces all of it.
void small(Channel& ch, Call& c, const FlatView& v, std::size_t es, int root) {
  const Op& op = *c.op;
  const int n = ch.size(), me = ch.me();
  const std::size_t bytes = v.bytes();
  const std::uint64_t k = ch.begin_round(c);
  char* mine = ch.buf(me, k);
  v.gather(0, bytes, mine);
  ch.publish(k, op);
  ch.signal(Channel::A(k));
  ch.wait_all(Channel::A(k), c);
  ch.match(k, c);
  if (!receives(me, root)) return;
  const ReduceSpec spec = reduce_spec_of(op, static_cast<std::int64_t>(bytes / es));
  std::vector<const void*> ins(static_cast<std::size_t>(n));
  std::vector<void*> outs(1);
  v.for_each(0, bytes, [&](char* p, std::size_t at, std::size_t nb) {
    for (int g = 0; g < n; ++g) ins[static_cast<std::size_t>(g)] = ch.buf(g, k) + at;
    outs[0] = p;
    reduce_members(spec, ins, outs, static_cast<std::int64_t>(at / es), static_cast<std::int64_t>(nb / es));
  });
}

/// Processes: chunks of the buffer size; member g reduces slice g of every
/// chunk over all buffers, then each receiver copies the other slices out.
void staged(Channel& ch, Call& c, const FlatView& v, std::size_t es, int root) {
  const Op& op = *c.op;
  const int n = ch.size(), me = ch.me();
  const std::int64_t total = static_cast<std::int64_t>(v.bytes() / es);
  const std::int64_t per = std::max<std::int64_t>(1, static_cast<std::int64_t>(ch.buf_bytes() / es));
  const ReduceSpec spec = reduce_spec_of(op, total);
  std::vector<const void*> ins(static_cast<std::size_t>(n));
  std::vector<void*> outs;
  auto slice = [&](std::int64_t c0, std::int64_t m, int g) {
    return std::pair<std::int64_t, std::int64_t>{c0 + m * g / n, c0 + m * (g + 1) / n};
  };
  for (std::int64_t c0 = 0; c0 < total; c0 += per) {
    const std::int64_t m = std::min(per, total - c0);
    const std::uint64_t k = ch.begin_round(c);
    char* mine = ch.buf(me, k);
    const auto at = [&](std::int64_t e) { return static_cast<std::size_t>((e - c0) * static_cast<std::int64_t>(es)); };
    for (int g = 0; g < n; ++g) {  // the slices the others reduce (ours we read in place)
      if (g == me) continue;
      auto [lo, hi] = slice(c0, m, g);
      v.gather(static_cast<std::size_t>(lo) * es, static_cast<std::size_t>(hi) * es, mine + at(lo));
    }
    if (c0 == 0) ch.publish(k, op);
    ch.signal(Channel::A(k));
    ch.wait_all(Channel::A(k), c);
    if (c0 == 0) ch.match(k, c);
    auto [lo, hi] = slice(c0, m, me);
    v.for_each(static_cast<std::size_t>(lo) * es, static_cast<std::size_t>(hi) * es,
               [&](char* p, std::size_t byte, std::size_t nb) {
                 const std::int64_t e = static_cast<std::int64_t>(byte / es);
                 for (int g = 0; g < n; ++g) ins[static_cast<std::size_t>(g)] = g == me ? p : ch.buf(g, k) + at(e);
                 outs.assign(1, mine + at(e));
                 if (receives(me, root)) outs.push_back(p);
                 reduce_members(spec, ins, outs, e, static_cast<std::int64_t>(nb / es));
               });
    ch.signal(Channel::B(k));
    if (!receives(me, root)) continue;
    ch.wait_all(Channel::B(k), c);
    for (int g = 0; g < n; ++g) {
      if (g == me) continue;
      auto [glo, ghi] = slice(c0, m, g);
      v.scatter(static_cast<std::size_t>(glo) * es, static_cast<std::size_t>(ghi) * es, ch.buf(g, k) + at(glo));
    }
  }
}

/// The least a member's slice of the direct way holds (but the last
/// members' slices may be empty): a member reads every member's tensors for
/// its slice, and with thousands of simulated members a slice of a few
/// elements costs the look-ups of every member's tensors, not the adding.
constexpr std::size_t kMinSliceBytes = 4096;

/// Threads: member g reduces slice g of the whole buffer (slices of at least
/// kMinSliceBytes: the first members only, when there is little data),
/// reading every member's tensors and writing each receiver's result in place.
void direct(Channel& ch, Call& c, const FlatView& v, std::size_t es, int root) {
  const Op& op = *c.op;
  const int n = ch.size(), me = ch.me();
  const std::uint64_t k = ch.meet(c);
  const std::int64_t total = static_cast<std::int64_t>(v.bytes() / es);
  const std::int64_t least = std::max<std::int64_t>(1, static_cast<std::int64_t>(kMinSliceBytes / es));
  const std::int64_t parts = std::clamp<std::int64_t>(total / least, 1, n);
  const std::int64_t lo = me < parts ? total * me / parts : total, hi = me < parts ? total * (me + 1) / parts : total;
  if (lo < hi) {
    // The members' tensors have the sizes of this member's (the descriptors
    // matched), so each piece of the slice is the same tensor at the same
    // offset in every member's list: one address per member and piece, no
    // view of a member's whole list (O(members x tensors) for each member).
    // A member with an empty slice (more members than elements) reads none.
    std::vector<const Op*> ops(static_cast<std::size_t>(n));
    for (int g = 0; g < n; ++g) ops[static_cast<std::size_t>(g)] = g == me ? &op : &ch.peer_op(g, k);
    const ReduceSpec spec = reduce_spec_of(op, total);
    std::vector<const void*> ins(static_cast<std::size_t>(n));
    std::vector<void*> outs;
    v.for_each_piece(static_cast<std::size_t>(lo) * es, static_cast<std::size_t>(hi) * es,
                     [&](std::size_t t, std::size_t offset, std::size_t byte, std::size_t nb) {
                       outs.clear();
                       for (int g = 0; g < n; ++g) {
                         char* p = static_cast<char*>(ops[static_cast<std::size_t>(g)]->tensors[t].data_ptr()) + offset;
                         ins[static_cast<std::size_t>(g)] = p;
                         if (receives(g, root)) outs.push_back(p);
                       }
                       reduce_members(spec, ins, outs, static_cast<std::int64_t>(byte / es),
                                      static_cast<std::int64_t>(nb / es));
                     });
  }
  ch.signal(Channel::B(k));
  ch.wait_all(Channel::B(k), c);
}

}  // namespace

namespace {

void reduce_to(Channel& ch, Call& c, int root) {
  const Op& op = *c.op;
  const FlatView v(op.tensors, 0, op.tensors.size());
  const std::size_t es = itemsize(op.desc.dtype);
  if (small_fits(ch, v.bytes())) return small(ch, c, v, es, root);
  if (ch.in_process()) return direct(ch, c, v, es, root);
  staged(ch, c, v, es, root);
}

}  // namespace

void all_reduce(Channel& ch, Call& c) { reduce_to(ch, c, -1); }

void reduce(Channel& ch, Call& c) { reduce_to(ch, c, c.op->desc.root); }

}  // namespace dopt::detail::shm_plane
