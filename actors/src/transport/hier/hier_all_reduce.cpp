// all_reduce on the hierarchical plane (also all_reduce_coalesced, and
// reduce and reduce_scatter, which are all_reduces whose result only part
// of the ranks keep).
//
// Rounds of buffer-sized chunks. In each, every member stages its chunk in
// its shared-memory buffer; member j of each host owns slice j of the chunk.
// For each run of elements with one reduction order (reduce_members'), the
// order is cut into runs of ranks on one host: the first host's member j
// accumulates its host's values of the slice (from the staged buffers), sends
// the accumulator to member j of the next host in the order, which adds its
// host's values, and so on; the last host finishes the result and sends it to
// member j of every other host. Then every member has its slice of the
// result, and the host's members gather the other slices from each other's
// buffers. With one member per host: the TCP ring instead (hier_ring.cpp).
#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "plane/kernels.hpp"
#include "transport/hier/hier_group.hpp"
#include "transport/hier/hier_reduce_plan.hpp"
#include "transport/shm/flat_view.hpp"

namespace dopt::detail::hier {

using shm_plane::FlatView;

/// The all_reduce of `v` (every member passes the same layout), staged;
/// `matched`: the call's first round is done and matched (its rounds start
/// afresh).
void staged_all_reduce(HierGroup& g, HierCall& c, const FlatView& v, DType dtype, ReduceOp op, bool matched) {
  const Op& call = *c.local.op;
  const Topology& t = g.topo();
  Channel& ch = g.local();
  const int L = t.per_host(), me_host = t.host(), j = t.local();
  const int n = static_cast<int>(t.members.size());
  const ReduceGeometry geo(call, v.bytes(), ch.buf_bytes(), dtype, op);
  const std::int64_t es = geo.es, total = geo.total, per = geo.per;
  const std::size_t aes = geo.aes;
  const ReduceSpec& spec = geo.spec;
  std::int64_t c0 = 0;
  std::uint64_t chunk = 0;
  do {
    const std::int64_t m = std::min(per, total - c0);
    const std::uint64_t k = ch.begin_round(c.local);
    char* mine = ch.buf(ch.me(), k);
    auto at = [&](std::int64_t e) { return static_cast<std::size_t>((e - c0) * es); };
    // My slice of the chunk, [lo, hi): only I read my values there (from
    // the tensors), so only the other members' slices are staged; the
    // buffer's slice receives the result.
    const std::int64_t lo = c0 + m * j / L, hi = c0 + m * (j + 1) / L;
    auto bytes_at = [&](std::int64_t e) { return static_cast<std::size_t>(e * es); };
    if (lo > c0) v.gather(bytes_at(c0), bytes_at(lo), mine);
    if (c0 + m > hi) v.gather(bytes_at(hi), bytes_at(c0 + m), mine + at(hi));
    const bool first = c0 == 0 && !matched;
    if (first) ch.publish(k, call);
    ch.signal(Channel::A(k));
    ch.wait_all(Channel::A(k), c.local);
    if (first) g.match(k, c);
    // My slice of the chunk, run by run (each cut into same-host pieces of its order).
    const SlicePlan plan = plan_slice(t, spec, lo, hi, aes);
    const std::vector<RankRun>& runs = plan.runs;
    const std::vector<Pieces>& cut = plan.cut;
    const std::vector<std::size_t>& acc_at = plan.acc_at;
    // The accumulators: the group's scratch (no allocation, no zeroing per
    // round), kept alive by the transfers in case a failed wait leaves them.
    const std::shared_ptr<char[]> scratch = g.scratch(acc_at.back());
    auto acc_of = [&](std::size_t r) { return scratch.get() + acc_at[r]; };
    Transfers sends(g.mesh()), results(g.mesh());
    std::vector<int> cross;  // who this chunk waits for
    auto waits_for = [&](int who) {
      if (std::find(cross.begin(), cross.end(), who) == cross.end()) cross.push_back(who);
    };
    // Every accumulator this host receives, posted before any arrives (so
    // the mesh reads it straight into place). An accumulator arrives only
    // once the previous piece's send of the same run left this rank, so a
    // run whose order visits this host twice reuses its buffer safely.
    std::map<std::pair<std::size_t, std::size_t>, std::unique_ptr<Transfers>> chain_in;
    for (std::size_t r = 0; r < runs.size(); ++r)
      for (std::size_t p = 1; p < cut[r].size(); ++p) {
        if (cut[r][p].first != me_host) continue;
        auto& in = chain_in[{r, p}];
        in = std::make_unique<Transfers>(g.mesh());
        const int from = t.at(cut[r][p - 1].first, j);
        in->recv(g.global(from), chain_tag(g, c, chunk, r, p), acc_of(r),
                 acc_at[r + 1] - acc_at[r], scratch);
      }
    std::vector<bool> finished_here(runs.size(), false);
    for (std::size_t r = 0; r < runs.size(); ++r) {
      const RankRun& run = runs[r];
      const Pieces& pieces = cut[r];
      char* acc = acc_of(r);
      const std::size_t acc_bytes = acc_at[r + 1] - acc_at[r];
      for (std::size_t p = 0; p < pieces.size(); ++p) {
        if (pieces[p].first != me_host) continue;
        const void* acc_in = nullptr;
        if (p > 0) {  // the accumulator from the previous host
          const int from = t.at(pieces[p - 1].first, j);
          g.wait(*chain_in[{r, p}], c, {from});
          acc_in = acc;
        }
        std::vector<const void*> ins;
        for (int gr : pieces[p].second) {
          if (gr != t.me) {
            ins.push_back(ch.buf(t.local_of[static_cast<std::size_t>(gr)], k) + at(run.lo));
            continue;
          }
          // Mine from the tensors (staged first where they are not one
          // range: the result overwrites it only after this run's pieces).
          const std::size_t b0 = bytes_at(run.lo), nb = bytes_at(run.count);
          const char* p_mine = v.contiguous(b0, nb);
          if (!p_mine) {
            v.gather(b0, b0 + nb, mine + at(run.lo));
            p_mine = mine + at(run.lo);
          }
          ins.push_back(p_mine);
        }
        accumulate(op, dtype, call.desc.pre_divisor, acc_in, ins, acc, run.count);
        if (p + 1 < pieces.size()) {
          const int to = t.at(pieces[p + 1].first, j);
          sends.send(g.global(to), chain_tag(g, c, chunk, r, p + 1), acc, acc_bytes, scratch);
          g.count_cross(acc_bytes);
          waits_for(to);
        } else {  // the last piece: the result, for every other host
          finalize(op, dtype, n, acc, mine + at(run.lo), run.count);
          finished_here[r] = true;
          for (int h = 0; h < t.num_hosts(); ++h) {
            if (h == me_host) continue;
            const int to = t.at(h, j);
            sends.send(g.global(to), result_tag(g, c, chunk, r), mine + at(run.lo), static_cast<std::size_t>(run.count * es));
            g.count_cross(static_cast<std::size_t>(run.count * es));
            waits_for(to);
          }
        }
      }
      if (!finished_here[r]) {  // the result comes from the last host
        const int from = t.at(pieces.back().first, j);
        results.recv(g.global(from), result_tag(g, c, chunk, r), mine + at(run.lo), static_cast<std::size_t>(run.count * es));
        waits_for(from);
      }
    }
    g.wait(results, c, cross);
    g.wait(sends, c, cross);  // the mesh no longer reads this buffer
    ch.signal(Channel::B(k));
    ch.wait_all(Channel::B(k), c.local);
    // Every slice of the chunk, from its owner's buffer (mine included).
    for (int i = 0; i < L; ++i) {
      const std::int64_t slo = c0 + m * i / L, shi = c0 + m * (i + 1) / L;
      if (shi > slo)
        v.scatter(static_cast<std::size_t>(slo * es), static_cast<std::size_t>(shi * es), ch.buf(i, k) + at(slo));
    }
    c0 += per;
    ++chunk;
  } while (c0 < total);
}

namespace {

/// Cross-memory where the host's members can, else staged.
void run(HierGroup& g, HierCall& c, const std::vector<Tensor>& tensors, DType dtype, ReduceOp op) {
  bool matched = false;
  if (cross_memory_all_reduce(g, c, tensors, dtype, op, matched)) return;
  staged_all_reduce(g, c, FlatView(tensors, 0, tensors.size()), dtype, op, matched);
}

}  // namespace

void all_reduce(HierGroup& g, HierCall& c) {
  const Op& op = *c.local.op;
  switch (op.desc.kind) {
    case CollKind::all_reduce:
    case CollKind::all_reduce_coalesced:
      if (whole_all_reduce(g, c, op.tensors, op.desc.dtype, op.desc.op)) return;
      return run(g, c, op.tensors, op.desc.dtype, op.desc.op);
    case CollKind::reduce: {
      // Every member computes the result; only dst keeps it.
      const bool dst = g.topo().me == op.desc.root;
      const Tensor& t = op.tensors[0];
      Tensor work = dst ? t : t.clone();
      if (whole_all_reduce(g, c, {work}, op.desc.dtype, op.desc.op)) return;
      return run(g, c, {work}, op.desc.dtype, op.desc.op);
    }
    case CollKind::reduce_scatter: {
      // [output, in_0, ..., in_{n-1}]: all_reduce the inputs as one buffer
      // (a copy), keep this member's part.
      const int n = static_cast<int>(g.topo().members.size());
      const Tensor& out = op.tensors[0];
      Tensor all = Tensor::empty({out.numel() * n}, out.dtype());
      for (int r = 0; r < n; ++r) all.flat_slice(out.numel() * r, out.numel()).copy_(op.tensors[static_cast<std::size_t>(1 + r)]);
      if (!whole_all_reduce(g, c, {all}, op.desc.dtype, op.desc.op)) run(g, c, {all}, op.desc.dtype, op.desc.op);
      out.copy_(all.flat_slice(out.numel() * g.topo().me, out.numel()).view(out.shape()));
      return;
    }
    default: break;
  }
  throw StateError(c.local.name, "not an all_reduce", g.global(g.topo().me));
}

}  // namespace dopt::detail::hier
