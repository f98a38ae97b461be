// detail::agree_averager_config (averager_agreement.hpp): one all_gather of
// a fixed-size int64 encoding of each rank's averager configuration.
#include "local_sgd/averager_agreement.hpp"

#include <cstring>
#include <vector>

#include "dopt/runtime/error.hpp"
#include "dopt/runtime/tensor.hpp"

namespace dopt::optim::detail {
namespace {

/// Levels shown in a message; every level counts in the comparison (hash).
constexpr int kShown = 14;
/// kind, warm-up, level count, hash of all levels, then kShown (period, size) pairs.
constexpr int kLength = 4 + 2 * kShown;

Tensor encode(const AveragerConfig& c) {
  Tensor t = Tensor::zeros({kLength}, DType::int64);
  auto* v = t.data<std::int64_t>();
  v[0] = c.kind;
  v[1] = c.warmup_steps;
  v[2] = static_cast<std::int64_t>(c.levels.size());
  std::uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a over the pairs
  auto eat = [&h](std::uint64_t x) {
    for (int b = 0; b < 8; ++b) {
      h ^= (x >> (8 * b)) & 0xff;
      h *= 0x100000001b3ull;
    }
  };
  int i = 0;
  for (const auto& [period, size] : c.levels) {
    eat(static_cast<std::uint64_t>(period));
    eat(static_cast<std::uint64_t>(size));
    if (i < kShown) {
      v[4 + 2 * i] = period;
      v[5 + 2 * i] = size;
    }
    ++i;
  }
  v[3] = static_cast<std::int64_t>(h);
  return t;
}

std::string describe_encoded(const std::int64_t* v) {
  std::string out;
  const std::int64_t n = v[2];
  if (v[0] == AveragerConfig::periodic) {
    out = "PeriodicModelAverager period " + std::to_string(v[4]);
  } else if (v[0] == AveragerConfig::hierarchical) {
    out = "HierarchicalModelAverager {";
    for (std::int64_t i = 0; i < n && i < kShown; ++i)
      out += (i ? ", " : "") + std::to_string(v[4 + 2 * i]) + ": " + std::to_string(v[5 + 2 * i]);
    out += n > kShown ? ", ... (" + std::to_string(n) + " levels)}" : "}";
  } else {
    out = "an averager of kind " + std::to_string(v[0]);
  }
  return out + ", warm-up " + std::to_string(v[1]);
}

}  // namespace

std::string describe(const AveragerConfig& c) {
  const Tensor t = encode(c);
  return describe_encoded(t.data<std::int64_t>());
}

void agree_averager_config(ProcessGroup& group, const AveragerConfig& mine, const char* op) {
  const Tensor in = encode(mine);
  std::vector<Tensor> all;
  for (int r = 0; r < group.size(); ++r) all.push_back(Tensor::zeros({kLength}, DType::int64));
  group.all_gather(all, in);
  const std::size_t bytes = kLength * sizeof(std::int64_t);
  const auto* first = all[0].data<std::int64_t>();
  for (int r = 1; r < group.size(); ++r) {
    const auto* theirs = all[static_cast<std::size_t>(r)].data<std::int64_t>();
    if (std::memcmp(theirs, first, bytes) == 0) continue;
    const int me = group.rank();
    const std::string who = r == me ? std::string("this rank's averager (group rank ") : "the averager of group rank ";
    throw ValueError(op,
                     who + std::to_string(r) + ", global rank " + std::to_string(group.global_rank(r)) +
                         (r == me ? "), " : ", ") + describe_encoded(theirs) + ", differs from group rank 0's, " +
                         describe_encoded(first) +
                         ": every rank of the group must build the same averager (a newcomer with the members' "
                         "kind, map or period and warm-up)",
                     me);
  }
}

}  // namespace dopt::optim::detail
