// dopt-train --zero-stage (tools/dopt_train, docs/dopt-train.md) run as a
// process: stage 2 ends with the same parameters, byte for byte, as stage 1,
// with simulated ranks and under dopt-run; --zero-stage with another --optim
// or with --survive exits 2 with a clear line.
#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <filesystem>

#include "processes.hpp"
#include "train_jobs.hpp"

namespace {

using namespace dopt::testing;
namespace fs = std::filesystem;

std::vector<std::string> stage_args(int stage, int ranks, const fs::path& dump) {
  return {"--optim", "zero", "--zero-stage", std::to_string(stage), "--ranks", std::to_string(ranks), "--steps", "30",
          "--hidden", "64", "--layers", "3", "--quiet", "--dump-params", dump.string()};
}

Done train(std::vector<std::string> args) {
  args.insert(args.begin(), kDoptTrain);
  return wait(start(args, kTrainEnv));
}

}  // namespace

TEST_CASE("dopt-train: --zero-stage 2 ends bit for bit where --zero-stage 1 ends (3, 5 simulated ranks)",
          "[train][zero][stage2]") {
  const int ranks = GENERATE(3, 5);
  INFO(ranks << " ranks");
  TempDir dir("dopt-train-stage2", std::to_string(ranks));
  for (int stage : {1, 2}) {
    const Done d = train(stage_args(stage, ranks, dir.path / ("stage" + std::to_string(stage) + ".st")));
    INFO(d.out);
    REQUIRE(d.ok());
  }
  CHECK(slurp((dir.path / "stage1.st").string()) == slurp((dir.path / "stage2.st").string()));
}

TEST_CASE("dopt-train: --zero-stage 2 under dopt-run (2 processes) ends bit for bit where stage 1 ends",
          "[train][zero][stage2][multiprocess]") {
  TempDir dir("dopt-train-stage2-mp", "2");
  for (int stage : {1, 2}) {
    const Done d = run_through_dopt_run(tool_path("dopt-run"), kDoptTrain, 2,
                                        stage_args(stage, 2, dir.path / ("stage" + std::to_string(stage) + ".st")),
                                        kTrainEnv);
    INFO(d.out);
    REQUIRE(d.ok());
  }
  CHECK(slurp((dir.path / "stage1.st").string()) == slurp((dir.path / "stage2.st").string()));
}

TEST_CASE("dopt-train: --zero-stage 2 with --optim ddp or with --survive is a usage error", "[train][zero][stage2]") {
  const Done a = train({"--optim", "ddp", "--zero-stage", "2", "--ranks", "2", "--steps", "2"});
  CHECK(WIFEXITED(a.status));
  CHECK(WEXITSTATUS(a.status) == 2);
  CHECK(contains(a.out, "--zero-stage 2 needs --optim zero"));
  const Done b = train({"--optim", "zero", "--zero-stage", "2", "--survive", "--ranks", "2", "--steps", "2"});
  CHECK(WIFEXITED(b.status));
  CHECK(WEXITSTATUS(b.status) == 2);
  CHECK(contains(b.out, "--zero-stage 2 does not go with --survive"));
}
