// Reliability of real processes: every wait is bounded and names its cause,
// ranks of another job (or without the job's secret) never join, latecomers
// and duplicates are told at once. The ranks are tests/rendezvous_peer.cpp
// (and dopt-train), started by hand or through dopt-run. CTest labels:
// "reliability" (tests/reliability.cmake), "multiprocess" where processes
// rendezvous, "slow" where a deadline must run out.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "process_util.hpp"

namespace {

using namespace dopt_test;
namespace fs = std::filesystem;

const std::string kReplay = std::string(DOPT_BINARY_DIR) + "/tools/dopt-replay";

}  // namespace

TEST_CASE("dopt-replay: a world_size that does not fit is refused before narrowing", "[reliability]") {
  const std::string src = std::string(DOPT_SHARED_DIR) + "/conformance/cases/zero_adam_ws2";
  if (!fs::exists(src)) {
    WARN("no conformance case at " << src << "; skipped");
    return;
  }
  TempDir dir("dopt-replay-world", "x");
  const fs::path c = dir.path / "case";
  fs::copy(src, c);
  const std::string json = slurp((c / "case.json").string());
  for (const std::string w : {"4294967298", "100000", "0", "-2"}) {
    INFO(w);
    std::string j = json;
    const auto at = j.find("\"world_size\": 2");
    REQUIRE(at != std::string::npos);
    j.replace(at, 15, "\"world_size\": " + w);
    std::ofstream(c / "case.json", std::ios::trunc) << j;
    const Done d = wait(start({kReplay, c.string(), "--out", (dir.path / "out.safetensors").string()}, {}));
    INFO(d.out);
    CHECK(d.failed());
    CHECK(contains(d.out, "world_size must be in 1..1024, got " + w));
  }
}
