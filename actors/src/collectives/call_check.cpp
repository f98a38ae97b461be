// check_calls_match (dopt/actors/internal/device_plane.hpp): the comparison of
// a device plane's calls across ranks, over the group's CPU plane.
#include <algorithm>
#include <cstring>
#include <string>

#include <xxhash.h>

#include "dopt/actors/internal/device_plane.hpp"
#include "dopt/actors/internal/call_label.hpp"
#include "plane/failure.hpp"

namespace dopt::detail {
namespace {

// One rank's record: its sequence number, a hash of its whole descriptor
// (XXH3-64: the same value in every build, so ranks built apart agree), and
// the descriptor's text (cut to fit) for the message.
constexpr std::size_t kText = 240;
struct Record {
  std::uint64_t seq = 0;
  std::uint64_t hash = 0;
  char text[kText] = {};
  char caller[64] = {};  // the public call that issued it (cut; not compared)
};

std::string key_of(const CollDesc& d) {
  return d.str() + " order " + std::to_string(static_cast<int>(d.order)) + " pre_divisor " +
         std::to_string(d.pre_divisor);
}

Record record_of(const Op& op) {
  Record r;
  r.seq = op.seq;
  const std::string key = key_of(op.desc);
  r.hash = XXH3_64bits(key.data(), key.size());
  const std::string s = op.desc.str();
  std::memcpy(r.text, s.data(), std::min(s.size(), kText - 1));
  std::memcpy(r.caller, op.desc.caller.data(), std::min(op.desc.caller.size(), sizeof r.caller - 1));
  return r;
}

}  // namespace

void check_calls_match(ProcessGroup cpu, const Op& op) {
  if (op.desc.kind == CollKind::send || op.desc.kind == CollKind::recv) return;
  const auto n = static_cast<std::int64_t>(sizeof(Record));
  const Record mine = record_of(op);
  Tensor in = Tensor::empty({n}, DType::uint8);
  std::memcpy(in.data_ptr(), &mine, sizeof mine);
  Tensor all = Tensor::empty({n * cpu.size()}, DType::uint8);
  cpu.all_gather_into_tensor(all, in);
  const auto* recs = static_cast<const Record*>(all.data_ptr());
  std::vector<std::pair<int, std::string>> calls;
  for (int g = 0; g < cpu.size(); ++g)
    calls.emplace_back(cpu.global_rank(g), std::string(recs[g].caller, strnlen(recs[g].caller, sizeof recs[g].caller)));
  for (int g = 0; g < cpu.size(); ++g) {
    const Record& r = recs[g];
    if (r.seq == recs[0].seq && r.hash == recs[0].hash) continue;
    const std::string ref(recs[0].text, strnlen(recs[0].text, kText));
    const std::string other(r.text, strnlen(r.text, kText));
    std::string msg = "collective mismatch in " + group_str(op.gid) + " at seq " + std::to_string(recs[0].seq) +
                      ": rank " + std::to_string(cpu.global_rank(0)) + " called " + ref + " but rank " +
                      std::to_string(cpu.global_rank(g)) + " called " + other;
    if (r.seq != recs[0].seq) msg += " (at seq " + std::to_string(r.seq) + ")";
    throw CollectiveMismatchError(op.desc.who(), mismatch_text(calls, msg), cpu.global_rank(cpu.rank()));
  }
}

}  // namespace dopt::detail
