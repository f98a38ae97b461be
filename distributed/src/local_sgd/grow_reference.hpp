#pragma once
// The reference runs of the growing-back tests of post-local SGD and DiLoCo,
// shared by the simulated tests (grow_test_support.hpp and the *_grow.test.cpp
// beside it) and the test between processes (tests/local_sgd_grow_peer.cpp),
// so that each reference is written once. No Catch2, no simulation: plain
// loops over every rank in one thread, on the test's thread.
//
// Who is there at step t is a Plan: the members from the start, one of them
// lost from step lost_at on, newcomers (fresh ranks, or the lost rank's
// replacement between processes) from join_at on. Each rank runs its own
// local optimizer on its own gradients (set_rank_grads); a newcomer, at
// join_at, becomes a copy of the lowest-ranked member there (its parameters
// and local optimizer state: what post_local_sgd_catch_up sends). The
// averages are over the ranks there, in group rank order (ascending global
// ranks), added in gloo's ring order (ring_order_reference.hpp).
#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "dopt/optim/registry.hpp"
#include "dopt/runtime/tensor.hpp"
#include "ring_order_reference.hpp"
#include "zero/zero_survive_reference.hpp"

namespace dopt::grow_test {

/// Each parameter's values, per rank.
using Params = std::vector<std::vector<float>>;

/// Rank r's gradients of step t: parameter i's element k is grad_elem(r, t, i, k).
inline void set_rank_grads(const std::vector<Tensor>& params, int r, std::int64_t t) {
  for (std::size_t i = 0; i < params.size(); ++i) {
    Tensor g = Tensor::zeros({params[i].numel()});
    for (std::int64_t k = 0; k < params[i].numel(); ++k)
      g.data<float>()[k] = optim::survive_reference::grad_elem(r, t, i, k);
    params[i].set_grad(g);
  }
}

inline Params values_of(const std::vector<Tensor>& params) {
  Params out;
  for (const auto& p : params) out.push_back(p.to_vector<float>());
  return out;
}

/// Who is there at which step: ranks 0 .. members() - 1 from the start but
/// `lost` from step lost_at on; the `newcomers` ranks from `newcomer` on
/// from join_at on. A newcomer is a fresh rank (newcomer >= members(), the
/// simulated tests) or the lost rank's replacement (newcomer == lost, between
/// processes: it takes the lost rank's number).
struct Plan {
  int lost = 3;
  std::int64_t lost_at = 2;
  int newcomer = 5;
  std::int64_t join_at = 4;
  int newcomers = 1;
  /// Ranks at the start (0: `newcomer`, the first newcomer following them).
  int world = 0;

  int members() const { return world > 0 ? world : newcomer; }
  /// Every rank there ever is: members() and the newcomers.
  int slots() const { return std::max(members(), newcomer + newcomers); }
  bool joins(int r) const { return r >= newcomer && r < newcomer + newcomers; }
  /// The ranks there at step t, ascending.
  std::vector<int> present(std::int64_t t) const {
    std::vector<int> out;
    for (int r = 0; r < slots(); ++r)
      if ((t >= join_at && joins(r)) || (r < members() && (r != lost || t < lost_at))) out.push_back(r);
    return out;
  }
};

/// The ranks of a reference run, in one thread: each rank's parameters
/// (survive_reference::make_params) and its own optimizer (`spec`).
class RefRanks {
 public:
  RefRanks(const Plan& plan, std::vector<std::int64_t> sizes, optim::OptimizerSpec spec)
      : plan_(plan), sizes_(std::move(sizes)), spec_(std::move(spec)), params_(plan.slots()), opts_(plan.slots()) {
    for (int r = 0; r < plan_.members(); ++r) make(r, optim::survive_reference::make_params(sizes_));
  }

  /// Step t's local part: at join_at each newcomer becomes a copy of the
  /// lowest-ranked member there (its parameters and optimizer state); then
  /// every rank there sets its gradients (set_rank_grads) and steps. Returns
  /// the ranks there.
  std::vector<int> step(std::int64_t t) {
    const auto ranks = plan_.present(t);
    if (t == plan_.join_at) {
      const int from = *std::find_if(ranks.begin(), ranks.end(), [&](int r) { return !plan_.joins(r); });
      for (int r : ranks) {
        if (!plan_.joins(r)) continue;
        std::vector<Tensor> copy;
        for (const auto& p : params(from)) copy.push_back(p.clone());
        make(r, copy);
        opts_[static_cast<std::size_t>(r)]->load_state_dict(opts_[static_cast<std::size_t>(from)]->state_dict());
      }
    }
    for (int r : ranks) {
      set_rank_grads(params(r), r, t);
      opts_[static_cast<std::size_t>(r)]->step();
    }
    return ranks;
  }

  std::vector<Tensor>& params(int r) { return params_[static_cast<std::size_t>(r)]; }
  const std::vector<std::int64_t>& sizes() const { return sizes_; }

  std::vector<Params> values() const {
    std::vector<Params> out;
    for (const auto& ps : params_) out.push_back(values_of(ps));
    return out;
  }

 private:
  void make(int r, std::vector<Tensor> ps) {
    params_[static_cast<std::size_t>(r)] = std::move(ps);
    opts_[static_cast<std::size_t>(r)] = optim::make_optimizer(spec_, {optim::OptimizerParamGroup(params(r))});
  }

  Plan plan_;
  std::vector<std::int64_t> sizes_;
  optim::OptimizerSpec spec_;
  std::vector<std::vector<Tensor>> params_;
  std::vector<std::unique_ptr<optim::Optimizer>> opts_;
};

/// sum over the n group ranks of value(g), in gloo's ring order for element
/// e of a flat float32 buffer of numel elements (the first term taken as is).
template <class Value>
float ring_sum(std::int64_t e, std::int64_t numel, int n, const Value& value) {
  float acc = 0.0f;
  for (int j = 0; j < n; ++j) {
    const float v = value(ring_reference::contributor(e, numel, n, j));
    acc = j == 0 ? v : acc + v;
  }
  return acc;
}

/// average_parameters over `ranks`: sum_r (p_r / n), the ranks' parameters
/// seen as one flat float32 buffer (gloo's ring order), written into every
/// one of them.
inline void ring_average(RefRanks& rs, const std::vector<int>& ranks) {
  const auto& sizes = rs.sizes();
  std::int64_t total = 0;
  for (auto s : sizes) total += s;
  const int n = static_cast<int>(ranks.size());
  std::int64_t base = 0;
  for (std::size_t i = 0; i < sizes.size(); base += sizes[i], ++i) {
    Tensor avg = Tensor::zeros({sizes[i]});
    for (std::int64_t k = 0; k < sizes[i]; ++k)
      avg.data<float>()[k] = ring_sum(base + k, total, n, [&](int g) {
        return rs.params(ranks[static_cast<std::size_t>(g)])[i].data<float>()[k] / static_cast<float>(n);
      });
    for (int r : ranks) rs.params(r)[i].copy_(avg);
  }
}

/// Post-local SGD with a PeriodicModelAverager(period, warmup): steps 0 ..
/// steps - 1, each rank's `inner` optimizer, an average over the ranks there
/// at steps warmup, warmup + period, ...
inline RefRanks periodic_reference(const Plan& plan, const std::vector<std::int64_t>& sizes,
                                   const optim::OptimizerSpec& inner, std::int64_t warmup, std::int64_t period,
                                   std::int64_t steps) {
  RefRanks rs(plan, sizes, inner);
  for (std::int64_t t = 0; t < steps; ++t) {
    const auto ranks = rs.step(t);
    if (t >= warmup && (t - warmup) % period == 0) ring_average(rs, ranks);
  }
  return rs;
}

/// Post-local SGD with a HierarchicalModelAverager over the ranks there:
/// levels(n) is its map (period -> group size) over a group of n ranks. From
/// step warmup on, the level of the largest period dividing t averages: the
/// ranks there in consecutive blocks of its group size (the whole group for
/// the last level), each block on its own.
template <class Levels>
RefRanks hierarchical_reference(const Plan& plan, const std::vector<std::int64_t>& sizes,
                                const optim::OptimizerSpec& inner, std::int64_t warmup, const Levels& levels,
                                std::int64_t steps) {
  RefRanks rs(plan, sizes, inner);
  for (std::int64_t t = 0; t < steps; ++t) {
    const auto ranks = rs.step(t);
    if (t < warmup) continue;
    const std::map<std::int64_t, int> map = levels(static_cast<int>(ranks.size()));
    for (auto it = map.rbegin(); it != map.rend(); ++it) {
      if (t % it->first != 0) continue;
      for (std::size_t b = 0; b < ranks.size(); b += static_cast<std::size_t>(it->second))
        ring_average(rs, std::vector<int>(ranks.begin() + static_cast<std::ptrdiff_t>(b),
                                          ranks.begin() + static_cast<std::ptrdiff_t>(b) + it->second));
      break;
    }
  }
  return rs;
}

/// Streaming DiLoCo's reference (the configuration of the growing-back
/// tests: `fragments`, sync_every = h * fragments, a delay): the anchors,
/// one outer optimizer per fragment over them, the average of the fragment
/// prepared last.
class DiLoCoReference {
 public:
  DiLoCoReference(std::vector<std::int64_t> sizes, std::vector<std::vector<std::int64_t>> fragments,
                  const optim::OptimizerSpec& outer)
      : sizes_(std::move(sizes)),
        fragments_(std::move(fragments)),
        anchors_(optim::survive_reference::make_params(sizes_)) {
    for (const auto& frag : fragments_) {
      std::vector<Tensor> mine;
      for (auto i : frag) mine.push_back(anchors_[static_cast<std::size_t>(i)]);
      outer_.push_back(optim::make_optimizer(outer, {optim::OptimizerParamGroup(mine)}));
    }
  }

  /// A prepare of fragment k: the deltas anchor - p_r of the ranks there
  /// (ascending) summed in gloo's ring order over the fragment's flat float32
  /// buffer, then divided by their count. `failed`: that average fails (a
  /// rank was lost), so the sync after it puts the fragment back at its anchors.
  void prepare(std::size_t k, bool failed, RefRanks& rs, const std::vector<int>& ranks) {
    pending_ = k;
    failed_ = failed;
    average_.clear();
    std::int64_t total = 0;
    for (auto i : fragments_[k]) total += sizes_[static_cast<std::size_t>(i)];
    const int n = static_cast<int>(ranks.size());
    std::int64_t base = 0;
    for (auto i : fragments_[k]) {
      const auto ii = static_cast<std::size_t>(i);
      Tensor avg = Tensor::zeros({sizes_[ii]});
      for (std::int64_t e = 0; e < sizes_[ii]; ++e) {
        const float sum = ring_sum(base + e, total, n, [&](int g) {
          const auto& p = rs.params(ranks[static_cast<std::size_t>(g)])[ii];
          return anchors_[ii].data<float>()[e] - p.data<float>()[e];
        });
        avg.data<float>()[e] = sum / static_cast<float>(n);
      }
      average_.push_back(avg);
      base += sizes_[ii];
    }
  }

  /// The sync of the fragment prepared last: its outer optimizer steps the
  /// anchors with the average (unless it failed) and every rank there takes
  /// the anchors (alpha 0).
  void sync(RefRanks& rs, const std::vector<int>& ranks) {
    const auto& frag = fragments_[pending_];
    if (!failed_) {
      for (std::size_t j = 0; j < frag.size(); ++j) anchors_[static_cast<std::size_t>(frag[j])].set_grad(average_[j]);
      outer_[pending_]->step();
      for (auto i : frag) anchors_[static_cast<std::size_t>(i)].set_grad(Tensor());
    }
    for (int r : ranks)  // the new anchors, or back to the old ones after a failed average
      for (auto i : frag) rs.params(r)[static_cast<std::size_t>(i)].copy_(anchors_[static_cast<std::size_t>(i)]);
  }

 private:
  std::vector<std::int64_t> sizes_;
  std::vector<std::vector<std::int64_t>> fragments_;
  std::vector<Tensor> anchors_;
  std::vector<std::unique_ptr<optim::Optimizer>> outer_;
  std::size_t pending_ = 0;
  bool failed_ = false;
  std::vector<Tensor> average_;
};

/// Streaming DiLoCo over the ranks there, steps 0 .. steps - 1: each rank's
/// `inner` optimizer; with H = h steps per fragment, at step t fragment
/// (t / h) % fragments is prepared when t % h + 1 == h - delay (failing at
/// plan.lost_at, the step whose average the lost rank misses) and synced when
/// t % h + 1 == h.
inline RefRanks diloco_reference(const Plan& plan, const std::vector<std::int64_t>& sizes,
                                 const std::vector<std::vector<std::int64_t>>& fragments,
                                 const optim::OptimizerSpec& inner, const optim::OptimizerSpec& outer, std::int64_t h,
                                 std::int64_t delay, std::int64_t steps) {
  RefRanks rs(plan, sizes, inner);
  DiLoCoReference global(sizes, fragments, outer);
  const auto f = static_cast<std::int64_t>(fragments.size());
  for (std::int64_t t = 0; t < steps; ++t) {
    const auto ranks = rs.step(t);
    const std::int64_t l = t % h + 1;
    if (l == h - delay) global.prepare(static_cast<std::size_t>((t / h) % f), t == plan.lost_at, rs, ranks);
    if (l == h) global.sync(rs, ranks);
  }
  return rs;
}

}  // namespace dopt::grow_test
