// detail::agree_averager_config (averager_agreement.hpp): one all_gather of
// a fixed-size int64 encoding of each rank's averager configuration.
#include "local_sgd/averager_agreement.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "dopt/runtime/error.hpp"
#include "dopt/runtime/tensor.hpp"

namespace dopt::optim::detail {
namespace {

/// Levels shown in a message; every level counts in the comparison (hash).
constexpr int kShown = 14;
/// The bytes of a setting's value shown in a message (the whole value counts: length and hash).
constexpr int kTextBytes = 128;
/// A setting: its value's hash, its length, then its first kTextBytes bytes.
constexpr int kSettingLength = 2 + kTextBytes / 8;
constexpr int kSettingsAt = 4 + 2 * kShown;
/// kind, warm-up, level count, hash of all levels, then kShown (period, size)
/// pairs, then kMaxSettings settings.
constexpr int kLength = kSettingsAt + kMaxSettings * kSettingLength;

struct Fnv {  // FNV-1a
  std::uint64_t h = 0xcbf29ce484222325ull;
  void eat(std::uint64_t x) {
    for (int b = 0; b < 8; ++b) {
      h ^= (x >> (8 * b)) & 0xff;
      h *= 0x100000001b3ull;
    }
  }
};

Tensor encode(const AveragerConfig& c) {
  Tensor t = Tensor::zeros({kLength}, DType::int64);
  auto* v = t.data<std::int64_t>();
  v[0] = c.kind;
  v[1] = c.warmup_steps;
  v[2] = static_cast<std::int64_t>(c.levels.size());
  Fnv levels;
  int i = 0;
  for (const auto& [period, size] : c.levels) {
    levels.eat(static_cast<std::uint64_t>(period));
    levels.eat(static_cast<std::uint64_t>(size));
    if (i < kShown) {
      v[4 + 2 * i] = period;
      v[5 + 2 * i] = size;
    }
    ++i;
  }
  v[3] = static_cast<std::int64_t>(levels.h);
  if (c.settings.size() > static_cast<std::size_t>(kMaxSettings))
    throw std::logic_error("agree_averager_config: more than kMaxSettings settings");
  for (std::size_t s = 0; s < c.settings.size(); ++s) {
    const std::string& value = c.settings[s].second;
    std::int64_t* slot = v + kSettingsAt + kSettingLength * static_cast<int>(s);
    Fnv h;
    for (unsigned char ch : value) h.eat(ch);
    slot[0] = static_cast<std::int64_t>(h.h);
    slot[1] = static_cast<std::int64_t>(value.size());
    std::memcpy(slot + 2, value.data(), std::min<std::size_t>(value.size(), kTextBytes));
  }
  return t;
}

/// A setting's value as the encoding shows it ("..." when it was longer).
std::string setting_value(const std::int64_t* v, int s) {
  const std::int64_t* slot = v + kSettingsAt + kSettingLength * s;
  const auto n = static_cast<std::size_t>(slot[1]);
  const std::string shown(reinterpret_cast<const char*>(slot + 2), std::min<std::size_t>(n, kTextBytes));
  return n > kTextBytes ? shown + "..." : shown;
}

bool same_setting(const std::int64_t* a, const std::int64_t* b, int s) {
  const int at = kSettingsAt + kSettingLength * s;
  return std::memcmp(a + at, b + at, kSettingLength * sizeof(std::int64_t)) == 0;
}

std::string describe_encoded(const std::int64_t* v, const AveragerConfig& mine) {
  std::string out;
  const std::int64_t n = v[2];
  if (v[0] == AveragerConfig::periodic) {
    out = "PeriodicModelAverager period " + std::to_string(v[4]);
  } else if (v[0] == AveragerConfig::hierarchical) {
    out = "HierarchicalModelAverager {";
    for (std::int64_t i = 0; i < n && i < kShown; ++i)
      out += (i ? ", " : "") + std::to_string(v[4 + 2 * i]) + ": " + std::to_string(v[5 + 2 * i]);
    out += n > kShown ? ", ... (" + std::to_string(n) + " levels)}" : "}";
  } else if (v[0] == AveragerConfig::diloco) {
    out = "DiLoCoAverager";
    // The names are this rank's; the values are in the same order on every DiLoCo rank.
    if (mine.kind == AveragerConfig::diloco)
      for (std::size_t s = 0; s < mine.settings.size(); ++s)
        out += (s ? ", " : " (") + mine.settings[s].first + " " + setting_value(v, static_cast<int>(s)) +
               (s + 1 == mine.settings.size() ? ")" : "");
  } else {
    out = "an averager of kind " + std::to_string(v[0]);
  }
  return out + ", warm-up " + std::to_string(v[1]);
}

/// "ranks 0-2, 4" / "rank 5".
std::string rank_list(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    out += (i ? ", " : "") + std::to_string(ranks[i]) + (j > i ? "-" + std::to_string(ranks[j]) : "");
    i = j + 1;
  }
  return out;
}

/// Every DiLoCo setting that is not the same on every rank: "name: ranks 0-3 have A, rank 4 has B".
std::string diloco_differences(ProcessGroup& group, const std::vector<Tensor>& all, const AveragerConfig& mine) {
  std::string out;
  for (int s = 0; s < static_cast<int>(mine.settings.size()); ++s) {
    std::vector<int> firsts;              // the group rank that first has each value
    std::vector<std::vector<int>> ranks;  // the global ranks that have it
    for (int r = 0; r < group.size(); ++r) {
      const auto* theirs = all[static_cast<std::size_t>(r)].data<std::int64_t>();
      std::size_t k = 0;
      while (k < firsts.size() &&
             !same_setting(all[static_cast<std::size_t>(firsts[k])].data<std::int64_t>(), theirs, s))
        ++k;
      if (k == firsts.size()) {
        firsts.push_back(r);
        ranks.emplace_back();
      }
      ranks[k].push_back(group.global_rank(r));
    }
    if (firsts.size() == 1) continue;
    out += (out.empty() ? "" : "; ") + mine.settings[static_cast<std::size_t>(s)].first + ": ";
    for (std::size_t k = 0; k < firsts.size(); ++k)
      out += (k ? ", " : "") + rank_list(ranks[k]) + (ranks[k].size() == 1 ? " has " : " have ") +
             setting_value(all[static_cast<std::size_t>(firsts[k])].data<std::int64_t>(), static_cast<int>(s));
  }
  return out;
}

}  // namespace

std::string describe(const AveragerConfig& c) {
  const Tensor t = encode(c);
  return describe_encoded(t.data<std::int64_t>(), c);
}

void agree_averager_config(ProcessGroup& group, const AveragerConfig& mine, const char* op) {
  const Tensor in = encode(mine);
  std::vector<Tensor> all;
  for (int r = 0; r < group.size(); ++r) all.push_back(Tensor::zeros({kLength}, DType::int64));
  group.all_gather(all, in);
  const std::size_t bytes = kLength * sizeof(std::int64_t);
  const auto* first = all[0].data<std::int64_t>();
  bool all_diloco = true;
  for (const auto& t : all) all_diloco = all_diloco && t.data<std::int64_t>()[0] == AveragerConfig::diloco;
  const int me = group.rank();
  for (int r = 1; r < group.size(); ++r) {
    const auto* theirs = all[static_cast<std::size_t>(r)].data<std::int64_t>();
    if (std::memcmp(theirs, first, bytes) == 0) continue;
    if (all_diloco)
      throw ValueError(
          op,
          "the ranks' DiLoCoAverager settings differ (global ranks): " + diloco_differences(group, all, mine) +
              ": every rank of the group must build the same DiLoCoAverager (a newcomer with the "
              "members' DiLoCoOptions and parameters)",
          me);
    const std::string who = r == me ? std::string("this rank's averager (group rank ") : "the averager of group rank ";
    throw ValueError(op,
                     who + std::to_string(r) + ", global rank " + std::to_string(group.global_rank(r)) +
                         (r == me ? "), " : ", ") + describe_encoded(theirs, mine) + ", differs from group rank 0's, " +
                         describe_encoded(first, mine) +
                         ": every rank of the group must build the same averager (a newcomer with the members' "
                         "kind, map or period and warm-up)",
                     me);
  }
}

}  // namespace dopt::optim::detail
