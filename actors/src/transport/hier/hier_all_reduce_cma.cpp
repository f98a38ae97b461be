// all_reduce on the hierarchical plane, cross-memory: the members of a host
// are processes that can read each other's memory (process_vm_readv), so
// nothing is staged in shared memory and the chunks are not rounds.
//
// The messages on the mesh are the staged way's (hier_reduce_plan.hpp):
// member j owns slice j of every buf_bytes chunk of the buffer, and passes
// its runs' accumulators along the hosts. What changes is where the values
// come from and go:
// * a member reads its host peers' values of its slice straight from their
//   tensors (they keep them until the end), adds its own from its tensor;
// * the last host finishes a run's result into its member's tensor and sends
//   it from there; the other hosts receive it straight into their tensors
//   (a member's own slice: only it reads its values there, before);
// * the chunks follow each other without a meeting of the host's members,
//   at most two in flight (their accumulators in the group's scratch);
// * at the end, once every member of the host has its slices, each reads the
//   others' slices of the result from their tensors, and nobody returns
//   before all have read.
// With two members per host a member copies half of the buffer in and half
// out (the staged way: half in, all of it out), and the link does not idle
// between chunks.
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

namespace {

/// Buffers from this size up take the cross-memory way where they can. 2
/// hosts x 2 ranks, alternated runs (docs/performance.md, 2026-12-05): 1 MiB
/// took 1.07x the staged time, 4 MiB 0.94x, 16 MiB 0.82x.
constexpr std::size_t k_cross_memory_bytes = std::size_t(4) << 20;

}  // namespace

bool cross_memory_all_reduce(HierGroup& g, HierCall& c, const std::vector<Tensor>& tensors, DType dtype,
                             ReduceOp op, bool& matched) {
  const shm_plane::FlatView v(tensors, 0, tensors.size());
  matched = false;
  Channel& ch = g.local();
  if (v.bytes() < k_cross_memory_bytes || !g.members_are_processes()) return false;
  const Op& call = *c.local.op;
  const Topology& t = g.topo();
  const int L = t.per_host(), H = t.num_hosts(), me_host = t.host(), j = t.local();
  const int n = static_cast<int>(t.members.size());
  const ReduceGeometry geo(call, v.bytes(), ch.buf_bytes(), dtype, op);
  const std::int64_t es = geo.es, total = geo.total, per = geo.per;
  const std::size_t aes = geo.aes;
  const ReduceSpec& spec = geo.spec;
  char* const base = v.contiguous(0, v.bytes());

  // The call's first round carries where each member's buffer is (0: not
  // one range).
  const std::uint64_t k = g.meet(c, {reinterpret_cast<std::uint64_t>(base)});
  matched = true;
  const auto table = g.cross_memory_entries(k, 1);
  if (table.empty()) return false;
  std::vector<std::uint64_t> peer_base;
  for (const auto& e : table) peer_base.push_back(e[0]);

  // The tensors outlive transfers that a failed wait leaves behind.
  const std::shared_ptr<void> keep = std::make_shared<std::vector<Tensor>>(tensors);
  auto bytes_at = [&](std::int64_t e) { return static_cast<std::size_t>(e * es); };
  std::vector<int> cross;  // the cross peers: whom the waits are for
  for (int h = 0; h < H; ++h)
    if (h != me_host) cross.push_back(t.at(h, j));
  const std::int64_t chunks = (total + per - 1) / per;
  auto slice = [&](std::int64_t chunk, int i) {  // member i's elements of a chunk
    const std::int64_t c0 = chunk * per, m = std::min(per, total - c0);
    return std::pair<std::int64_t, std::int64_t>{c0 + m * i / L, c0 + m * (i + 1) / L};
  };
  // Scratch: the accumulators of two chunks (chunk q in slot q % 2), and the
  // host peers' values of one run.
  const std::size_t slot_bytes = static_cast<std::size_t>(per / L + 1) * aes;
  const std::int64_t sub = std::max<std::int64_t>(1, static_cast<std::int64_t>((256u << 10) / aes));
  const std::shared_ptr<char[]> scratch =
      g.scratch(2 * slot_bytes + static_cast<std::size_t>(std::max(1, L - 1)) * static_cast<std::size_t>(sub * es));
  char* const theirs = scratch.get() + 2 * slot_bytes;

  std::vector<SlicePlan> plans(static_cast<std::size_t>(chunks));
  std::vector<std::unique_ptr<Transfers>> sends(static_cast<std::size_t>(chunks));
  std::vector<std::unique_ptr<Transfers>> results(static_cast<std::size_t>(chunks));
  std::map<std::tuple<std::int64_t, std::size_t, std::size_t>, std::unique_ptr<Transfers>> chain_in;
  auto acc_of = [&](std::int64_t q, std::size_t r) {
    return scratch.get() + static_cast<std::size_t>(q % 2) * slot_bytes + plans[static_cast<std::size_t>(q)].acc_at[r];
  };
  // Chunk q's plan, and every accumulator this host receives in it, posted
  // before any can arrive (read straight into place). Its slot is free: the
  // chunk before it there was worked through and its sends have left.
  auto post = [&](std::int64_t q) {
    const auto [lo, hi] = slice(q, j);
    SlicePlan& plan = plans[static_cast<std::size_t>(q)] = plan_slice(t, spec, lo, hi, aes);
    for (std::size_t r = 0; r < plan.runs.size(); ++r)
      for (std::size_t p = 1; p < plan.cut[r].size(); ++p) {
        if (plan.cut[r][p].first != me_host) continue;
        auto& in = chain_in[{q, r, p}];
        in = std::make_unique<Transfers>(g.mesh());
        const int from = t.at(plan.cut[r][p - 1].first, j);
        in->recv(g.global(from), chain_tag(g, c, static_cast<std::uint64_t>(q), r, p), acc_of(q, r),
                 plan.acc_at[r + 1] - plan.acc_at[r], scratch);
      }
  };
  // Chunk q's transfers are done (its slot and the mesh's buffers free).
  auto finish = [&](std::int64_t q) {
    const auto i = static_cast<std::size_t>(q);
    if (sends[i]) g.wait(*sends[i], c, cross);
    if (results[i]) g.wait(*results[i], c, cross);
    sends[i].reset();
    results[i].reset();
    plans[i] = SlicePlan{};
  };
  post(0);
  for (std::int64_t q = 0; q < chunks; ++q) {
    // At most two chunks in flight: a host first in the reduction order
    // receives nothing before the results, and would otherwise send every
    // chunk's accumulators before the next host posted their receives
    // (which the mesh would buffer and copy).
    if (q >= 2) finish(q - 2);
    if (q + 1 < chunks) {
      if (q >= 1 && sends[static_cast<std::size_t>(q - 1)]) g.wait(*sends[static_cast<std::size_t>(q - 1)], c, cross);
      post(q + 1);
    }
    const SlicePlan& plan = plans[static_cast<std::size_t>(q)];
    auto& out = sends[static_cast<std::size_t>(q)];
    out = std::make_unique<Transfers>(g.mesh());
    auto& in = results[static_cast<std::size_t>(q)];
    in = std::make_unique<Transfers>(g.mesh());
    for (std::size_t r = 0; r < plan.runs.size(); ++r) {
      const RankRun& run = plan.runs[r];
      const Pieces& pieces = plan.cut[r];
      char* acc = acc_of(q, r);
      char* mine = base + bytes_at(run.lo);  // this run in my tensor
      const std::size_t acc_bytes = plan.acc_at[r + 1] - plan.acc_at[r];
      const std::size_t run_bytes = bytes_at(run.count);
      bool finished_here = false;
      for (std::size_t p = 0; p < pieces.size(); ++p) {
        if (pieces[p].first != me_host) continue;
        const void* acc_in = nullptr;
        if (p > 0) {  // the accumulator from the previous host
          g.wait(*chain_in[{q, r, p}], c, {t.at(pieces[p - 1].first, j)});
          chain_in.erase({q, r, p});
          acc_in = acc;
        }
        std::vector<const void*> ins;
        std::size_t read = 0;
        for (int gr : pieces[p].second) {
          if (gr == t.me) {
            ins.push_back(mine);
            continue;
          }
          char* into = theirs + read * run_bytes;
          ++read;
          const int i = t.local_of[static_cast<std::size_t>(gr)];
          ch.cma_read(i, peer_base[static_cast<std::size_t>(i)] + bytes_at(run.lo), into, run_bytes, c.local);
          g.count_cma(run_bytes);
          ins.push_back(into);
        }
        accumulate(op, dtype, call.desc.pre_divisor, acc_in, ins, acc, run.count);
        if (p + 1 < pieces.size()) {
          const int to = t.at(pieces[p + 1].first, j);
          out->send(g.global(to), chain_tag(g, c, static_cast<std::uint64_t>(q), r, p + 1), acc, acc_bytes, scratch);
          g.count_cross(acc_bytes);
        } else {  // the last piece: the result, for every other host
          finalize(op, dtype, n, acc, mine, run.count);
          finished_here = true;
          for (int h = 0; h < H; ++h) {
            if (h == me_host) continue;
            out->send(g.global(t.at(h, j)), result_tag(g, c, static_cast<std::uint64_t>(q), r), mine, run_bytes, keep);
            g.count_cross(run_bytes);
          }
        }
      }
      if (!finished_here)  // the result comes from the last host, into my tensor
        in->recv(g.global(t.at(pieces.back().first, j)), result_tag(g, c, static_cast<std::uint64_t>(q), r), mine,
                 run_bytes, keep);
    }
  }
  for (std::int64_t q = std::max<std::int64_t>(0, chunks - 2); q < chunks; ++q) finish(q);
  // Every member of the host has its slices: the others', from their tensors.
  ch.signal(Channel::B(k));
  ch.wait_all(Channel::B(k), c.local);
  for (int d = 1; d < L; ++d) {
    const int i = (j + d) % L;
    for (std::int64_t q = 0; q < chunks; ++q) {
      const auto [lo, hi] = slice(q, i);
      if (hi <= lo) continue;
      ch.cma_read(i, peer_base[static_cast<std::size_t>(i)] + bytes_at(lo), base + bytes_at(lo), bytes_at(hi - lo),
                  c.local);
      g.count_cma(bytes_at(hi - lo));
    }
  }
  // Nobody returns (its tensors free to change) before every member read them.
  ch.sync(c.local);
  return true;
}

}  // namespace dopt::detail::hier
