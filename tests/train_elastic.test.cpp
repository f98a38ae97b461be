// dopt-train --elastic (tools/dopt_train, docs/dopt-train.md) run as a
// process: a checkpoint written by 2 ranks resumed at 3 and 5 simulated ranks,
// as under torchrun's elastic agent when a node joins (docs/launching.md,
// "torchrun's elastic agent"). ZeRO's optimizer state, resharded on load, ends
// bit for bit where DDP's (the whole state on every rank) ends, and its own
// checkpoints are then of the new rank count; without
// --elastic the other rank count is refused, naming the flag; per-rank models
// (post-local SGD) are refused by the Checkpointer, which cannot reshard them.
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <filesystem>

#include "processes.hpp"
#include "train_jobs.hpp"

namespace {

using namespace dopt::testing;
namespace fs = std::filesystem;

Done train(const std::string& mode, int ranks, int steps, std::vector<std::string> more) {
  std::vector<std::string> args{
      kDoptTrain, "--optim", mode,       "--ranks", std::to_string(ranks), "--steps", std::to_string(steps),
      "--hidden", "64",      "--layers", "3"};
  args.insert(args.end(), more.begin(), more.end());
  return wait(start(args, kTrainEnv));
}

}  // namespace

TEST_CASE(
    "dopt-train --elastic: a 2-rank checkpoint resumed at 3 and 5 simulated ranks, ZeRO resharded on load ends "
    "bit for bit where DDP ends",
    "[train][elastic]") {
  const int ranks = GENERATE(3, 5);
  INFO(ranks << " ranks resume");
  TempDir dir("dopt-train-elastic", std::to_string(ranks));
  for (const std::string mode : {"zero", "ddp"}) {
    const fs::path ck = dir.path / ("ck-" + mode);
    const Done a = train(mode, 2, 20, {"--checkpoint-dir", ck.string(), "--quiet"});
    INFO(a.out);
    REQUIRE(a.ok());
    const Done b = train(mode, ranks, 40,
                         {"--checkpoint-dir", ck.string(), "--resume", "--elastic", "--log-every", "100",
                          "--dump-params", (dir.path / (mode + ".st")).string()});
    INFO(b.out);
    REQUIRE(b.ok());
    CHECK(contains(b.out, "resuming from " + (ck / "step-00000020").string() + " at step 20"));
    CHECK(contains(b.out,
                   "the checkpoint was written by 2 ranks, this run has " + std::to_string(ranks) + " (--elastic)"));
    CHECK(contains(b.out, "dopt-train: 20 steps in"));
    // its checkpoints are of this rank count: resumed again without --elastic
    const Done c = train(mode, ranks, 50, {"--checkpoint-dir", ck.string(), "--resume", "--quiet"});
    INFO(c.out);
    CHECK(c.ok());
  }
  CHECK(slurp((dir.path / "zero.st").string()) == slurp((dir.path / "ddp.st").string()));
}

TEST_CASE(
    "dopt-train --elastic: without it another rank count is refused naming the flag, and per-rank models are "
    "refused by the Checkpointer",
    "[train][elastic]") {
  TempDir dir("dopt-train-elastic-refused", "3");
  const fs::path ck = dir.path / "ck";
  const Done a = train("zero", 2, 10, {"--checkpoint-dir", ck.string(), "--quiet"});
  INFO(a.out);
  REQUIRE(a.ok());
  const Done b = train("zero", 3, 20, {"--checkpoint-dir", ck.string(), "--resume"});
  INFO(b.out);
  CHECK(WIFEXITED(b.status));
  CHECK(WEXITSTATUS(b.status) == 1);
  CHECK(contains(b.out,
                 "--ranks: checkpoint 2, this run 3); resume with the checkpoint's settings (another number "
                 "of ranks: --elastic)"));
  const Done c = train("zero", 3, 20, {"--elastic"});
  INFO(c.out);
  CHECK(WIFEXITED(c.status));
  CHECK(WEXITSTATUS(c.status) == 2);
  CHECK(contains(c.out, "--elastic needs --resume or --resume-from"));

  const fs::path pl = dir.path / "pl";
  const Done d = train("post-local-sgd", 2, 10, {"--checkpoint-dir", pl.string(), "--quiet"});
  INFO(d.out);
  REQUIRE(d.ok());
  const Done e = train("post-local-sgd", 3, 20, {"--checkpoint-dir", pl.string(), "--resume", "--elastic"});
  INFO(e.out);
  CHECK(WIFEXITED(e.status));
  CHECK(WEXITSTATUS(e.status) == 1);
  CHECK(contains(e.out, "is per-rank state saved at 2 ranks, which cannot be loaded at 3 ranks"));
}
