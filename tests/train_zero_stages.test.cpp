// dopt-train --zero-stage (tools/dopt_train, docs/dopt-train.md) run as a
// process: stages 2 and 3 end with the same parameters, byte for byte, as
// stage 1, with simulated ranks and under dopt-run; a stage 3 run resumed
// from its sharded checkpoint ends where an uninterrupted one ends;
// --zero-stage with another --optim or with --survive exits 2 with a clear
// line.
#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <filesystem>

#include "processes.hpp"
#include "train_jobs.hpp"

namespace {

using namespace dopt::testing;
namespace fs = std::filesystem;

std::vector<std::string> stage_args(int stage, int ranks, const fs::path& dump, const std::string& inner = "adam") {
  return {"--optim", "zero", "--zero-stage", std::to_string(stage), "--ranks", std::to_string(ranks), "--steps", "30",
          "--hidden", "64", "--layers", "3", "--inner", inner, "--quiet", "--dump-params", dump.string()};
}

Done train(std::vector<std::string> args) {
  args.insert(args.begin(), kDoptTrain);
  return wait(start(args, kTrainEnv));
}

/// dopt-train with `args` exits 2 and prints `words`.
void check_usage_error(const std::vector<std::string>& args, const std::string& words) {
  const Done d = train(args);
  INFO(d.out);
  CHECK(WIFEXITED(d.status));
  CHECK(WEXITSTATUS(d.status) == 2);
  CHECK(contains(d.out, words));
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
  check_usage_error({"--optim", "ddp", "--zero-stage", "2", "--ranks", "2", "--steps", "2"},
                    "--zero-stage 2 needs --optim zero");
  check_usage_error({"--optim", "zero", "--zero-stage", "2", "--survive", "--ranks", "2", "--steps", "2"},
                    "--zero-stage 2 does not go with --survive");
}

TEST_CASE("dopt-train: --zero-stage 3 ends bit for bit where --zero-stage 1 ends (3, 5 simulated ranks, each --inner)",
          "[train][zero][stage3]") {
  const int ranks = GENERATE(3, 5);
  const std::string inner = GENERATE("adam", "adamw", "sgd", "adagrad", "rmsprop", "adamax", "adadelta", "rprop");
  INFO(ranks << " ranks, " << inner);
  TempDir dir("dopt-train-stage3", std::to_string(ranks) + inner);
  for (int stage : {1, 3}) {
    const Done d = train(stage_args(stage, ranks, dir.path / ("stage" + std::to_string(stage) + ".st"), inner));
    INFO(d.out);
    REQUIRE(d.ok());
  }
  CHECK(slurp((dir.path / "stage1.st").string()) == slurp((dir.path / "stage3.st").string()));
}

TEST_CASE("dopt-train: --zero-stage 3 under dopt-run (2 and 3 processes) ends bit for bit where stage 1 ends",
          "[train][zero][stage3][multiprocess]") {
  const int n = GENERATE(2, 3);
  TempDir dir("dopt-train-stage3-mp", std::to_string(n));
  for (int stage : {1, 3}) {
    const Done d = run_through_dopt_run(tool_path("dopt-run"), kDoptTrain, n,
                                        stage_args(stage, n, dir.path / ("stage" + std::to_string(stage) + ".st")),
                                        kTrainEnv);
    INFO(d.out);
    REQUIRE(d.ok());
  }
  CHECK(slurp((dir.path / "stage1.st").string()) == slurp((dir.path / "stage3.st").string()));
}

TEST_CASE("dopt-train: --zero-stage 3 with --survive is a usage error", "[train][zero][stage3]") {
  check_usage_error({"--optim", "zero", "--zero-stage", "3", "--ranks", "2", "--steps", "2", "--survive"},
                    "--zero-stage 3 does not go with --survive yet");
}

TEST_CASE("dopt-train: --zero-stage 3 resumed from its sharded checkpoint ends bitwise where an uninterrupted run "
          "ends (3 simulated ranks)",
          "[train][zero][stage3]") {
  TempDir dir("dopt-train-stage3-resume", "3");
  const fs::path ck = dir.path / "ck", full = dir.path / "full.st", resumed = dir.path / "resumed.st";
  auto args = [&](int ranks, int steps, std::vector<std::string> more) {
    std::vector<std::string> a = stage_args(3, ranks, full);
    a.erase(a.end() - 2, a.end());  // no --dump-params unless asked
    a[std::size_t(7)] = std::to_string(steps);
    a.insert(a.end(), more.begin(), more.end());
    return a;
  };
  const Done a = train(args(3, 30, {"--dump-params", full.string()}));
  INFO(a.out);
  REQUIRE(a.ok());
  const Done b = train(args(3, 20, {"--checkpoint-dir", ck.string(), "--checkpoint-every", "10"}));
  INFO(b.out);
  REQUIRE(b.ok());
  CHECK(fs::exists(ck / "step-00000020" / "optim" / "units-rank2-of-3.safetensors"));
  const Done c = train(args(3, 30, {"--checkpoint-dir", ck.string(), "--resume", "--dump-params", resumed.string()}));
  INFO(c.out);
  REQUIRE(c.ok());
  CHECK(contains(c.out, "dopt-train: 10 steps"));  // it went on from step 20 (--quiet prints no resume line)
  REQUIRE(fs::exists(resumed));
  CHECK(slurp(full.string()) == slurp(resumed.string()));  // every rank's parameters, bitwise
}
