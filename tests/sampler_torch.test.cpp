// dopt::DistributedSampler against torch.utils.data.DistributedSampler of
// the reference peer (Debian's python3-torch 1.13), index for index: sizes,
// world sizes 1-5, seeds (also past 32 bits and negative as torch takes
// them), epochs, shuffle and drop_last. Skipped without python3-torch.
#include <catch2/catch.hpp>

#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dopt/runtime/distributed_sampler.hpp"

namespace {

std::string run_python(const std::string& script) {
  const std::string cmd = "/usr/bin/python3 -c '" + script + "' 2>/dev/null";
  std::string out;
  if (FILE* p = ::popen(cmd.c_str(), "r")) {
    char buf[65536];
    std::size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    if (::pclose(p) != 0) out.clear();
  }
  return out;
}

}  // namespace

TEST_CASE("DistributedSampler gives every rank torch 1.13's DistributedSampler indices, index for index",
          "[sampler][torch]") {
  // One python process prints torch's lists for every case as JSON.
  const std::string script = R"PY(
import json, torch
from torch.utils.data.distributed import DistributedSampler
out = []
for n in (0, 1, 3, 10, 17, 1000, 4099):
    for world in (1, 2, 3, 5):
        for seed in (0, 1, 42, 2**32 + 5, -3):
            for drop_last in (False, True):
                for shuffle in (True, False):
                    for epoch in (0, 1, 7):
                        if not shuffle and (seed != 0 or epoch != 0):
                            continue
                        for rank in range(world):
                            s = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=shuffle,
                                                   seed=seed, drop_last=drop_last)
                            s.set_epoch(epoch)
                            out.append([n, world, rank, seed, drop_last, shuffle, epoch, len(s), list(s)])
print(json.dumps(out))
)PY";
  const std::string text = run_python(script);
  if (text.empty()) {
    WARN("python3-torch is not installed (or failed): torch's DistributedSampler cannot be asked; skipped");
    return;
  }
  const auto cases = nlohmann::json::parse(text);
  REQUIRE(cases.size() > 1000);
  std::size_t checked = 0;
  for (const auto& c : cases) {
    const auto n = c[0].get<std::int64_t>();
    const int world = c[1].get<int>(), rank = c[2].get<int>();
    const auto seed = static_cast<std::uint64_t>(c[3].get<std::int64_t>());  // two's complement, as torch takes it
    const bool drop_last = c[4].get<bool>(), shuffle = c[5].get<bool>();
    const auto epoch = c[6].get<std::int64_t>();
    dopt::DistributedSampler s(n, world, rank,
                               dopt::DistributedSamplerOptions().seed(seed).drop_last(drop_last).shuffle(shuffle));
    s.set_epoch(epoch);
    INFO("n " << n << " world " << world << " rank " << rank << " seed " << c[3] << " drop_last " << drop_last
              << " shuffle " << shuffle << " epoch " << epoch);
    CHECK(s.size() == c[7].get<std::int64_t>());
    CHECK(s.indices() == c[8].get<std::vector<std::int64_t>>());
    ++checked;
  }
  CHECK(checked == cases.size());
}
