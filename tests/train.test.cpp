// dopt-train (tools/dopt_train, docs/dopt-train.md) run as a process: in each
// mode the loss falls, with simulated ranks and under dopt-run; a run resumed
// from a checkpoint ends bitwise where an uninterrupted run ends (parameters
// of every rank and every step's loss); processes and simulated ranks train
// identically; bad flags exit 2 and bad checkpoints exit 1 with a clear line.
#include <catch2/catch.hpp>

#include <pty.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <tuple>

#include "dopt/runtime/safetensors.hpp"
#include "processes.hpp"
#include "train_jobs.hpp"

namespace {

using namespace dopt::testing;
namespace fs = std::filesystem;

const std::string kDoptRun = tool_path("dopt-run");

Done train(std::vector<std::string> args) {
  args.insert(args.begin(), kDoptTrain);
  return wait(start(args, kTrainEnv));
}

Done train_under_dopt_run(int n, const std::vector<std::string>& args) {
  return run_through_dopt_run(kDoptRun, kDoptTrain, n, args, kTrainEnv);
}

/// The loss fell: the mean of the last 10 steps is below half the first step's.
void require_loss_falls(const fs::path& metrics, long steps) {
  const auto l = losses(metrics);
  REQUIRE(static_cast<long>(l.size()) == steps);
  double tail = 0;
  for (std::size_t i = l.size() - 10; i < l.size(); ++i) tail += l[i].second / 10;
  INFO("first loss " << l.front().second << ", mean of the last 10 " << tail);
  CHECK(l.front().second > 1.5);  // about ln(10): an untrained 10-class model
  CHECK(tail < 0.5 * l.front().second);
}

const std::vector<std::string> kSmall{"--hidden", "64", "--layers", "3"};

std::vector<std::string> args_of(const std::string& mode, int ranks, long steps, std::vector<std::string> more) {
  std::vector<std::string> a{"--optim", mode, "--ranks", std::to_string(ranks), "--steps", std::to_string(steps)};
  a.insert(a.end(), kSmall.begin(), kSmall.end());
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

// Where a checkpoint folder of `mode` keeps rank r's parameters and optimizer
// state at n ranks (docs/dopt-train.md, "Checkpoints"; the Checkpointer's
// layout): zero's and ddp's parameters, the same on every rank, and ddp's
// optimizer in replicated.safetensors; each rank's own in rank{r}-of-{n};
// ZeRO's shards under optim/.
std::string rank_file(int r, int n) { return "rank" + std::to_string(r) + "-of-" + std::to_string(n) + ".safetensors"; }
std::string model_file(const std::string& mode, int r, int n) {
  return mode == "zero" || mode == "ddp" ? "replicated.safetensors" : rank_file(r, n);
}
std::string optim_file(const std::string& mode, int r, int n) {
  if (mode == "zero") return "optim/optim-" + rank_file(r, n);
  return mode == "ddp" ? "replicated.safetensors" : rank_file(r, n);
}

}  // namespace

TEST_CASE("dopt-train: the loss falls in each mode with simulated ranks (3, and 5 for ZeRO)", "[train]") {
  const std::string mode = GENERATE("zero", "ddp", "post-local-sgd");
  const int ranks = mode == std::string("zero") ? GENERATE(3, 5) : 3;
  INFO(mode << " with " << ranks << " ranks");
  TempDir dir("dopt-train", mode + std::to_string(ranks));
  const Done d = train(args_of(mode, ranks, 200, {"--metrics", (dir.path / "m.jsonl").string(), "--svg",
                                                  (dir.path / "loss.svg").string()}));
  INFO(d.out);
  REQUIRE(d.ok());
  CHECK(contains(d.out, "optimizer state per rank after the first step"));
  CHECK(contains(d.out, "rank " + std::to_string(ranks - 1) + ": "));
  CHECK(contains(d.out, "steps/s"));
  require_loss_falls(dir.path / "m.jsonl", 200);
  const std::string svg = slurp((dir.path / "loss.svg").string());
  CHECK(contains(svg, "<svg"));
  CHECK(contains(svg, "<polyline"));
  CHECK(contains(svg, "</svg>"));
}

TEST_CASE("dopt-train: every --inner optimizer trains under ZeRO (3 simulated ranks)", "[train]") {
  const std::string inner = GENERATE("adam", "adamw", "sgd", "adagrad", "rmsprop", "adamax", "adadelta", "rprop");
  INFO(inner);
  TempDir dir("dopt-train-inner", inner);
  const Done d = train(args_of("zero", 3, 300, {"--inner", inner, "--quiet", "--metrics", (dir.path / "m.jsonl").string()}));
  INFO(d.out);
  REQUIRE(d.ok());
  require_loss_falls(dir.path / "m.jsonl", 300);
}

TEST_CASE("dopt-train: on a terminal the progress bar is redrawn in place, in a file, plain lines", "[train]") {
  // stdout a pseudo-terminal: the bar.
  int master = -1;
  const pid_t pid = ::forkpty(&master, nullptr, nullptr, nullptr);
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::unsetenv("RANK");
    ::unsetenv("WORLD_SIZE");
    ::execl(kDoptTrain.c_str(), kDoptTrain.c_str(), "--ranks", "3", "--steps", "30", "--hidden", "32", "--layers", "2",
            static_cast<char*>(nullptr));
    ::_exit(126);
  }
  std::string tty;
  char buf[4096];
  for (;;) {
    const ssize_t k = ::read(master, buf, sizeof buf);
    if (k <= 0) break;  // EIO once the child is gone
    tty.append(buf, static_cast<std::size_t>(k));
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  ::close(master);
  INFO(tty);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(contains(tty, "\r[##############################] step 30/30  loss "));
  CHECK(contains(tty, "steps/s  ETA "));
  CHECK_FALSE(contains(tty, "\nstep 1/30"));
  // stdout a file: plain lines every --log-every steps (and the first and last).
  const Done d = train({"--ranks", "3", "--steps", "30", "--hidden", "32", "--layers", "2", "--log-every", "10"});
  INFO(d.out);
  REQUIRE(d.ok());
  CHECK_FALSE(contains(d.out, "\r"));
  for (const char* line : {"\nstep 1/30  loss ", "\nstep 10/30  loss ", "\nstep 20/30  loss ", "\nstep 30/30  loss "})
    CHECK(contains(d.out, line));
  CHECK_FALSE(contains(d.out, "step 11/30"));
  // --quiet: the summary only (its two lines: the run, the bytes sent).
  const Done q = train({"--ranks", "3", "--steps", "30", "--hidden", "32", "--layers", "2", "--quiet"});
  REQUIRE(q.ok());
  INFO(q.out);
  CHECK(lines_of(q.out).size() == 2);
  CHECK(contains(q.out, "dopt-train: 30 steps in "));
  CHECK(contains(q.out, "\nbytes sent per rank: "));
}

TEST_CASE("dopt-train: ZeRO shards the optimizer state, DDP keeps a full copy on every rank", "[train]") {
  const Done z = train(args_of("zero", 3, 2, {}));
  const Done p = train(args_of("ddp", 3, 2, {}));
  INFO(z.out << p.out);
  REQUIRE(z.ok());
  REQUIRE(p.ok());
  CHECK(contains(z.out, "without ZeRO every rank would hold all"));
  CHECK(contains(p.out, "each holds a full copy"));
  // 64-64-64 with 32 inputs and 10 classes: 4,096 + 4,096 + 2,048 + 650 + 192 = 11,082 parameters.
  CHECK(contains(p.out, "rank 2: 86.6 KiB (state of 11,082 of 11,082 parameters)"));
  CHECK_FALSE(contains(z.out, "of 11,082 of 11,082"));
}

TEST_CASE("dopt-train: memory per rank in the report, the metrics and the SVG, and ZeRO stage 2 holds fewer gradient bytes",
          "[train]") {
  TempDir dir("dopt-train-memory", "stages");
  // One field of the last --metrics line.
  auto last = [](const fs::path& metrics, const char* key) {
    const auto lines = lines_of(slurp(metrics.string()));
    REQUIRE_FALSE(lines.empty());
    return nlohmann::json::parse(lines.back()).at(key).get<double>();
  };
  double mem[2] = {0, 0};
  for (int stage : {1, 2}) {
    INFO("stage " << stage);
    const fs::path m = dir.path / ("m" + std::to_string(stage) + ".jsonl"), svg = dir.path / "loss.svg";
    const Done d = train(args_of("zero", 3, 20, {"--zero-stage", std::to_string(stage), "--metrics", m.string(),
                                                 "--svg", svg.string()}));
    INFO(d.out);
    REQUIRE(d.ok());
    CHECK(contains(d.out, "memory per rank after the first step (parameters + gradients + optimizer state; peak RSS):"));
    // 11,082 float32 parameters on every rank: 43.3 KiB.
    for (int r = 0; r < 3; ++r) CHECK(contains(d.out, "  rank " + std::to_string(r) + ": 43.3 KiB + "));
    mem[stage - 1] = last(m, "mem_bytes");
    CHECK(mem[stage - 1] > 11082 * 4 * 2);  // at least the parameters and their state's part
    CHECK(last(m, "peak_rss") > mem[stage - 1]);
    const std::string pic = slurp(svg.string());
    CHECK(contains(pic, "memory per rank, MB"));
    CHECK(contains(pic, "stroke=\"#d95f02\""));  // the memory curve beside the loss
  }
  // Stage 2 keeps the owned gradients and one bucket, not every gradient and bucket.
  CHECK(mem[1] < mem[0]);
}

TEST_CASE("dopt-train: a resumed run ends bitwise where an uninterrupted one ends (simulated, each mode)", "[train]") {
  const std::string mode = GENERATE("zero", "ddp", "post-local-sgd");
  INFO(mode);
  TempDir dir("dopt-train-resume", mode);
  const fs::path ck = dir.path / "ck", full = dir.path / "full.st", resumed = dir.path / "resumed.st";
  // post-local SGD: the interruption falls inside warm-up (step 20 < 25), the end after it.
  std::vector<std::string> pl;
  if (mode == std::string("post-local-sgd")) pl = {"--plsgd-warmup", "25", "--plsgd-period", "3"};
  auto with = [&](std::vector<std::string> a) {
    a.insert(a.end(), pl.begin(), pl.end());
    return a;
  };
  const Done a = train(args_of(mode, 3, 50, with({"--dump-params", full.string(), "--metrics",
                                                  (dir.path / "full.jsonl").string()})));
  INFO(a.out);
  REQUIRE(a.ok());
  const Done b = train(args_of(mode, 3, 20, with({"--checkpoint-dir", ck.string(), "--checkpoint-every", "10",
                                                  "--metrics", (dir.path / "part.jsonl").string()})));
  INFO(b.out);
  REQUIRE(b.ok());
  CHECK(fs::exists(ck / "step-00000010" / "checkpoint.json"));
  CHECK(fs::exists(ck / "step-00000020" / optim_file(mode, 2, 3)));
  CHECK(fs::exists(ck / "step-00000020" / model_file(mode, 2, 3)));
  const Done c = train(args_of(mode, 3, 50, with({"--checkpoint-dir", ck.string(), "--resume", "--dump-params",
                                                  resumed.string(), "--metrics",
                                                  (dir.path / "part.jsonl").string()})));
  INFO(c.out);
  REQUIRE(c.ok());
  CHECK(contains(c.out, "at step 20"));
  REQUIRE(fs::exists(resumed));
  CHECK(slurp(full.string()) == slurp(resumed.string()));  // every rank's parameters, bitwise
  CHECK(losses(dir.path / "full.jsonl") == losses(dir.path / "part.jsonl"));  // every step's loss
}

TEST_CASE("dopt-train: Ctrl-C checkpoints the step it stops at, --resume continues exactly", "[train]") {
  const std::string mode = GENERATE("zero", "post-local-sgd");
  INFO(mode);
  TempDir dir("dopt-train-sigint", mode);
  const fs::path ck = dir.path / "ck";
  const Done a = train(args_of(mode, 3, 40, {"--quiet", "--dump-params", (dir.path / "a.st").string()}));
  REQUIRE(a.ok());
  // --interrupt-at-step raises SIGINT in rank 0 at that step: the ranks agree
  // (through the step's all_reduce) to stop after it and save a checkpoint.
  const Done b = train(args_of(mode, 3, 40, {"--checkpoint-dir", ck.string(), "--checkpoint-every", "10",
                                             "--interrupt-at-step", "17"}));
  INFO(b.out);
  CHECK(WIFEXITED(b.status));
  CHECK(WEXITSTATUS(b.status) == 130);
  CHECK(contains(b.out, "interrupted after step 17 of 40"));
  CHECK(fs::exists(ck / "step-00000017" / "checkpoint.json"));
  CHECK_FALSE(fs::exists(ck / "step-00000040"));
  const Done c = train(args_of(mode, 3, 40, {"--checkpoint-dir", ck.string(), "--resume", "--dump-params",
                                             (dir.path / "c.st").string()}));
  INFO(c.out);
  REQUIRE(c.ok());
  CHECK(contains(c.out, "at step 17"));
  CHECK(slurp((dir.path / "a.st").string()) == slurp((dir.path / "c.st").string()));
}

TEST_CASE("dopt-train: --resume-from an earlier checkpoint also continues exactly", "[train]") {
  TempDir dir("dopt-train-resume-from", "zero5");
  const fs::path ck = dir.path / "ck";
  const Done a = train(args_of("zero", 5, 30, {"--checkpoint-dir", ck.string(), "--checkpoint-every", "10",
                                               "--dump-params", (dir.path / "a.st").string()}));
  INFO(a.out);
  REQUIRE(a.ok());
  const Done b = train(args_of("zero", 5, 30, {"--resume-from", (ck / "step-00000010").string(), "--dump-params",
                                               (dir.path / "b.st").string()}));
  INFO(b.out);
  REQUIRE(b.ok());
  CHECK(slurp((dir.path / "a.st").string()) == slurp((dir.path / "b.st").string()));
}

TEST_CASE("dopt-train: bad flags exit 2 with CLI11's message", "[train]") {
  const std::vector<std::vector<std::string>> bad = {{"--optim", "adam"},  {"--inner", "lbfgs"},
                                                     {"--ranks", "0"},     {"--steps", "many"},
                                                     {"--no-such-flag"},   {"--resume"},
                                                     {"--checkpoint-every", "5"},
                                                     {"--plsgd-period", "2"},
                                                     {"--batch", "100000"}};
  for (const auto& args : bad) {
    const Done d = train(args);
    INFO(args.front() << ": " << d.out);
    CHECK(WIFEXITED(d.status));
    CHECK(WEXITSTATUS(d.status) == 2);
    CHECK(contains(d.out, args.front() == "--no-such-flag" ? "no-such-flag" : args.front()));
  }
  const Done h = train({"--help"});
  CHECK(h.ok());
  CHECK(contains(h.out, "--checkpoint-every"));
}

#ifndef DOPT_TRAIN_HAVE_REMOTE
TEST_CASE("dopt-train: --optim remote says it is not available in this build", "[train]") {
  const Done d = train({"--optim", "remote"});
  INFO(d.out);
  CHECK(d.failed());
  CHECK(contains(d.out, "dopt-train: error: --optim remote"));
  CHECK(contains(d.out, "not available in this build"));
}
#else
TEST_CASE("dopt-train: --optim remote (DistributedOptimizer with parameter owners) trains, bitwise like DDP",
          "[train][remote]") {
  TempDir dir("dopt-train-remote", "sim");
  const Done d = train(args_of("remote", 3, 200, {"--metrics", (dir.path / "m.jsonl").string(), "--dump-params",
                                                  (dir.path / "r.st").string(), "--svg-bytes",
                                                  (dir.path / "b.svg").string()}));
  INFO(d.out);
  REQUIRE(d.ok());
  CHECK(contains(d.out, "parameter owners"));
  CHECK(contains(d.out, "rank 2: "));
  require_loss_falls(dir.path / "m.jsonl", 200);
  // The bytes the workers' RPCs carried: growing every step, drawn with --svg-bytes.
  CHECK(contains(d.out, "bytes sent per worker: "));
  CHECK(contains(slurp((dir.path / "b.svg").string()), "MB sent per worker"));
  {
    std::ifstream in(dir.path / "m.jsonl");
    std::string line;
    double before = 0;
    int lines = 0;
    while (std::getline(in, line)) {
      const auto j = nlohmann::json::parse(line);
      CHECK(j.at("bytes_sent").get<double>() > before);
      CHECK(j.at("bytes_step").get<double>() > 0);
      before = j.at("bytes_sent").get<double>();
      ++lines;
    }
    CHECK(lines == 200);
  }
  // The owners' Adam on the rank-order average (sum_r g_r / n) is the DDP
  // reducer's average and Adam: the same bits.
  const Done p = train(args_of("ddp", 3, 200, {"--quiet", "--metrics", (dir.path / "d.jsonl").string(),
                                               "--dump-params", (dir.path / "d.st").string()}));
  INFO(p.out);
  REQUIRE(p.ok());
  CHECK(slurp((dir.path / "r.st").string()) == slurp((dir.path / "d.st").string()));
  CHECK(losses(dir.path / "m.jsonl") == losses(dir.path / "d.jsonl"));
  const Done c = train({"--optim", "remote", "--checkpoint-dir", (dir.path / "ck").string()});
  CHECK(WIFEXITED(c.status));
  CHECK(WEXITSTATUS(c.status) == 2);
  CHECK(contains(c.out, "checkpoints are not available with --optim remote"));
}

TEST_CASE("dopt-train multiprocess: --optim remote under dopt-run trains exactly like simulated workers",
          "[train][remote][multiprocess]") {
  TempDir dir("dopt-train-remote", "mp");
  const Done p = train_under_dopt_run(3, args_of("remote", 3, 120, {"--metrics", (dir.path / "m.jsonl").string(),
                                                                    "--dump-params", (dir.path / "p.st").string()}));
  INFO(p.out);
  REQUIRE(p.ok());
  require_loss_falls(dir.path / "m.jsonl", 120);
  const Done s = train(args_of("remote", 3, 120, {"--quiet", "--dump-params", (dir.path / "s.st").string()}));
  INFO(s.out);
  REQUIRE(s.ok());
  CHECK(slurp((dir.path / "p.st").string()) == slurp((dir.path / "s.st").string()));
}
#endif

TEST_CASE("dopt-train: wrong and corrupt checkpoints give one clear error and exit 1", "[train]") {
  TempDir dir("dopt-train-bad", "ck");
  const fs::path ck = dir.path / "ck", step = ck / "step-00000004";
  const Done a = train(args_of("zero", 3, 4, {"--checkpoint-dir", ck.string()}));
  INFO(a.out);
  REQUIRE(a.ok());
  REQUIRE(fs::exists(step / "checkpoint.json"));
  auto resume = [&](std::vector<std::string> more) {
    std::vector<std::string> a = args_of("zero", 3, 8, {"--resume-from", step.string()});
    a.insert(a.end(), more.begin(), more.end());
    return train(a);
  };
  SECTION("another mode, another rank count, another seed") {
    Done d = train(args_of("ddp", 3, 8, {"--resume-from", step.string()}));
    INFO(d.out);
    CHECK(d.failed());
    CHECK(contains(d.out, "different run (--optim: checkpoint \"zero\", this run \"ddp\")"));
    d = train(args_of("zero", 2, 8, {"--resume-from", step.string()}));
    CHECK(d.failed());
    CHECK(contains(d.out, "--ranks: checkpoint 3, this run 2"));
    d = resume({"--seed", "7"});
    CHECK(d.failed());
    CHECK(contains(d.out, "--seed: checkpoint 0, this run 7"));
  }
  SECTION("a truncated optimizer shard names the file") {
    const fs::path f = step / optim_file("zero", 1, 3);
    fs::resize_file(f, fs::file_size(f) / 2);
    const Done d = resume({});
    INFO(d.out);
    CHECK(d.failed());
    CHECK(contains(d.out, "dopt-train: error: "));
    CHECK(contains(d.out, "optim-rank1-of-3.safetensors"));
  }
  SECTION("a garbled model file names the file") {
    std::ofstream(step / model_file("zero", 2, 3), std::ios::trunc) << "not a safetensors file";
    const Done d = resume({});
    INFO(d.out);
    CHECK(d.failed());
    CHECK(contains(d.out, (step / model_file("zero", 2, 3)).string()));
  }
  SECTION("a corrupt or missing checkpoint.json") {
    std::ofstream(step / "checkpoint.json", std::ios::trunc) << "{\"format\": ";
    Done d = resume({});
    INFO(d.out);
    CHECK(d.failed());
    CHECK(contains(d.out, "checkpoint.json is corrupt"));
    fs::remove(step / "checkpoint.json");
    d = resume({});
    CHECK(d.failed());
    CHECK(contains(d.out, "is not a complete checkpoint"));
    d = train(args_of("zero", 3, 8, {"--checkpoint-dir", (dir.path / "empty").string(), "--resume=required"}));
    CHECK(d.failed());
    CHECK(contains(d.out, "--resume=required but there is no complete checkpoint in"));
  }
}

TEST_CASE("dopt-train multiprocess: under dopt-run the loss falls and processes train exactly like simulated ranks",
          "[train][multiprocess]") {
  const std::string mode = GENERATE("zero", "ddp", "post-local-sgd");
  INFO(mode);
  TempDir dir("dopt-train-mp", mode);
  const Done p = train_under_dopt_run(3, args_of(mode, 3, 120, {"--metrics", (dir.path / "m.jsonl").string(),
                                                                "--dump-params", (dir.path / "p.st").string()}));
  INFO(p.out);
  REQUIRE(p.ok());
  CHECK(contains(p.out, "[rank 0] dopt-train: MLP"));
  CHECK(contains(p.out, "3 processes"));
  require_loss_falls(dir.path / "m.jsonl", 120);
  const Done s = train(args_of(mode, 3, 120, {"--metrics", (dir.path / "s.jsonl").string(), "--dump-params",
                                              (dir.path / "s.st").string()}));
  INFO(s.out);
  REQUIRE(s.ok());
  CHECK(slurp((dir.path / "p.st").string()) == slurp((dir.path / "s.st").string()));
  CHECK(losses(dir.path / "m.jsonl") == losses(dir.path / "s.jsonl"));
}

TEST_CASE("dopt-train multiprocess: a SIGINT in one process stops every rank after the same step, with a checkpoint",
          "[train][multiprocess]") {
  TempDir dir("dopt-train-mp-sigint", "zero");
  const fs::path ck = dir.path / "ck";
  const Done a = train_under_dopt_run(3, args_of("zero", 3, 30, {"--quiet", "--dump-params", (dir.path / "a.st").string()}));
  REQUIRE(a.ok());
  const Done b = train_under_dopt_run(3, args_of("zero", 3, 30, {"--checkpoint-dir", ck.string(), "--interrupt-at-step", "12"}));
  INFO(b.out);
  CHECK(WIFEXITED(b.status));
  CHECK(WEXITSTATUS(b.status) == 130);
  CHECK(fs::exists(ck / "step-00000012" / "checkpoint.json"));
  const Done c = train_under_dopt_run(3, args_of("zero", 3, 30, {"--checkpoint-dir", ck.string(), "--resume",
                                                                 "--dump-params", (dir.path / "c.st").string()}));
  INFO(c.out);
  REQUIRE(c.ok());
  CHECK(slurp((dir.path / "a.st").string()) == slurp((dir.path / "c.st").string()));
}

TEST_CASE("dopt-train multiprocess: a run resumed under dopt-run ends bitwise where an uninterrupted run ends",
          "[train][multiprocess]") {
  const std::string mode = GENERATE("zero", "ddp", "post-local-sgd");
  INFO(mode);
  TempDir dir("dopt-train-mp-resume", mode);
  const fs::path ck = dir.path / "ck";
  const Done a = train_under_dopt_run(3, args_of(mode, 3, 40, {"--dump-params", (dir.path / "full.st").string()}));
  INFO(a.out);
  REQUIRE(a.ok());
  const Done b = train_under_dopt_run(3, args_of(mode, 3, 25, {"--checkpoint-dir", ck.string(), "--checkpoint-every", "10"}));
  INFO(b.out);
  REQUIRE(b.ok());
  CHECK(fs::exists(ck / "step-00000020" / "checkpoint.json"));
  CHECK(fs::exists(ck / "step-00000025" / "checkpoint.json"));  // the one at the end
  const Done c = train_under_dopt_run(3, args_of(mode, 3, 40, {"--checkpoint-dir", ck.string(), "--resume",
                                                               "--dump-params", (dir.path / "resumed.st").string()}));
  INFO(c.out);
  REQUIRE(c.ok());
  CHECK(contains(c.out, "at step 25"));
  CHECK(slurp((dir.path / "full.st").string()) == slurp((dir.path / "resumed.st").string()));
}

// --- checks before hours of work, checkpoints that prove their contents ------------------

TEST_CASE("dopt-train: an unusable --checkpoint-dir fails before the first step", "[train][reliability]") {
  TempDir dir("dopt-train-ckdir", "probe");
  const fs::path file = dir.path / "a-file";
  std::ofstream(file) << "x";
  struct Bad {
    std::string path, why;
  };
  std::vector<Bad> bad{{file.string(), file.string() + " exists but is not a folder"},
                       {(file / "sub").string(), "cannot create " + (file / "sub").string() + ": Not a directory"},
                       {"/proc/dopt-no-such-dir/ck", "cannot create /proc/dopt-no-such-dir/ck: "}};
  if (::geteuid() != 0) {  // root writes into a mode-000 folder anyway
    const fs::path ro = dir.path / "read-only";
    fs::create_directories(ro);
    fs::permissions(ro, fs::perms::none);
    bad.push_back({ro.string(), "cannot create a file in " + ro.string() + ": Permission denied"});
  }
  for (const Bad& b : bad) {
    INFO(b.path);
    const Done d = train(args_of("zero", 3, 3000, {"--checkpoint-dir", b.path, "--metrics",
                                                   (dir.path / "m.jsonl").string()}));
    INFO(d.out);
    CHECK(d.failed());
    CHECK(contains(d.out, "dopt-train: error: checkpoint [rank "));
    CHECK(contains(d.out, "--checkpoint-dir cannot be used: " + b.why));
    CHECK(contains(d.out, "(checked before the first step)"));
    CHECK(slurp((dir.path / "m.jsonl").string()).empty());  // not one step was trained
  }
  fs::permissions(dir.path, fs::perms::owner_all);
}

TEST_CASE("dopt-train: --resume starts fresh when there is no checkpoint yet, --resume=required does not",
          "[train][reliability]") {
  TempDir dir("dopt-train-resume-mode", "x");
  const fs::path ck = dir.path / "ck";
  Done d = train(args_of("zero", 3, 4, {"--checkpoint-dir", ck.string(), "--resume"}));
  INFO(d.out);
  REQUIRE(d.ok());
  CHECK(contains(d.out, "dopt-train: note: no checkpoint in " + ck.string() + " yet: starting at step 0"));
  CHECK(fs::exists(ck / "step-00000004" / "checkpoint.json"));
  d = train(args_of("zero", 3, 6, {"--checkpoint-dir", ck.string(), "--resume=required"}));
  INFO(d.out);
  REQUIRE(d.ok());
  CHECK(contains(d.out, "resuming from " + (ck / "step-00000004").string() + " at step 4"));
  d = train(args_of("zero", 3, 6, {"--checkpoint-dir", ck.string(), "--resume=maybe"}));
  CHECK(WEXITSTATUS(d.status) == 2);
}

TEST_CASE("dopt-train: --keep-last N keeps the newest N checkpoints", "[train][reliability]") {
  TempDir dir("dopt-train-keep", "x");
  const fs::path ck = dir.path / "ck";
  fs::create_directories(ck / "step-00000001.tmp");  // left behind by a crash
  const Done d = train(args_of("zero", 3, 20, {"--checkpoint-dir", ck.string(), "--checkpoint-every", "3",
                                               "--keep-last", "2"}));
  INFO(d.out);
  REQUIRE(d.ok());
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(ck)) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  CHECK(left == std::vector<std::string>{"step-00000018", "step-00000020"});
  CHECK(contains(d.out, "removed " + (ck / "step-00000003").string() + " (--keep-last 2)"));
  const Done u = train({"--keep-last", "2"});
  CHECK(WEXITSTATUS(u.status) == 2);
  CHECK(contains(u.out, "--keep-last needs --checkpoint-dir"));
}

TEST_CASE("dopt-train: a NaN loss stops the run with exit 1 and no NaN checkpoint, --nonfinite warn goes on without "
          "writing one",
          "[train][reliability]") {
  TempDir dir("dopt-train-nan", "x");
  const fs::path ck = dir.path / "ck", ck2 = dir.path / "ck2";
  // SGD with lr 1e38 overflows within a few steps.
  const Done d = train(args_of("ddp", 3, 30, {"--inner", "sgd", "--lr", "1e38", "--checkpoint-dir", ck.string(),
                                              "--checkpoint-every", "1", "--quiet"}));
  INFO(d.out);
  CHECK(d.failed());
  CHECK(contains(d.out, "dopt-train: error: train [rank "));
  CHECK(contains(d.out, ": non-finite values on 3 of 3 ranks"));
  CHECK(contains(d.out, "stopped without writing a checkpoint of it"));
  CHECK(contains(d.out, "pass --nonfinite warn to keep going"));
  // Every checkpoint that was written holds finite parameters and loads.
  int checked = 0;
  for (const auto& e : fs::directory_iterator(ck)) {
    for (int r = 0; r < 3; ++r) {
      const auto f = dopt::read_safetensors((e.path() / model_file("ddp", r, 3)).string());
      CHECK(f.verified);
      for (const auto& [name, t] : f.tensors) {
        if (name.rfind("model/", 0) != 0) continue;  // the parameters (ddp: the optimizer is in the same file)
        const auto v = t.to_vector<float>();
        CHECK(std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); }));
      }
      ++checked;
    }
  }
  CHECK(checked >= 3);
  const Done w = train(args_of("ddp", 3, 30, {"--inner", "sgd", "--lr", "1e38", "--checkpoint-dir", ck2.string(),
                                              "--checkpoint-every", "5", "--nonfinite", "warn"}));
  INFO(w.out);
  CHECK(w.ok());
  CHECK(contains(w.out, "dopt-train: warning: step "));
  CHECK(contains(w.out, "going on (--nonfinite warn)"));
  CHECK(contains(w.out, "dopt-train: warning: no checkpoint at step 30: the parameters hold non-finite values"));
  CHECK_FALSE(fs::exists(ck2 / "step-00000030"));
}

TEST_CASE("dopt-train: a flipped bit or a planted NaN in any checkpoint tensor is refused at resume, naming the file "
          "and the tensor",
          "[train][reliability]") {
  TempDir dir("dopt-train-tamper", "x");
  const fs::path ck = dir.path / "ck", step = ck / "step-00000004";
  const Done a = train(args_of("zero", 3, 4, {"--checkpoint-dir", ck.string(), "--quiet"}));
  INFO(a.out);
  REQUIRE(a.ok());
  int cases = 0;
  for (const std::string file : {model_file("zero", 1, 3), optim_file("zero", 2, 3)}) {
    const fs::path path = step / file;
    const std::string good = slurp(path.string());
    dopt::SafetensorsReader rd(path.string());
    for (const auto& e : rd.entries()) {
      const bool model = file == model_file("zero", 1, 3);
      for (const std::string kind : {"flip", "nan"}) {
        INFO(kind << " in " << file << " / " << e.name);
        if (kind == "flip") {
          std::string bad = good;
          bad[rd.data_offset() + e.begin + e.nbytes() / 2] ^= 0x01;
          std::ofstream(path, std::ios::binary | std::ios::trunc) << bad;
        } else {
          dopt::SafetensorsFile f = dopt::read_safetensors(path.string());
          dopt::Tensor t = f.tensors.at(e.name).clone();
          t.flatten().flat_slice(0, 1).fill_(std::nan(""));
          f.tensors[e.name] = t;
          dopt::write_safetensors(path.string(), f.tensors, f.metadata);  // with a valid checksum
        }
        const Done d = train(args_of("zero", 3, 8, {"--checkpoint-dir", ck.string(), "--resume", "--quiet"}));
        INFO(d.out);
        CHECK(d.failed());
        if (kind == "flip") {
          CHECK(contains(d.out, path.string() + ": tensor '" + e.name + "' does not match its checksum"));
        } else {
          const std::string tensor = model ? e.name : e.name;
          CHECK(contains(d.out, path.string() + ": tensor '" + tensor + "' holds NaN at element 0"));
        }
        std::ofstream(path, std::ios::binary | std::ios::trunc) << good;
        ++cases;
      }
    }
  }
  CHECK(cases >= 2 * (8 + 3));
  const Done ok = train(args_of("zero", 3, 6, {"--checkpoint-dir", ck.string(), "--resume", "--quiet"}));
  INFO(ok.out);
  CHECK(ok.ok());
}

TEST_CASE("dopt-train multiprocess: a rank waiting in the rendezvous ends at once on the first SIGTERM or SIGINT",
          "[train][multiprocess][reliability]") {
  for (int sig : {SIGTERM, SIGINT}) {
    INFO("signal " << sig);
    auto env = rank_env(1, 2, free_port());  // rank 0 never comes
    env.insert(kTrainEnv.begin(), kTrainEnv.end());
    env["RANK"] = "1";
    env["WORLD_SIZE"] = "2";
    const Proc p = start({kDoptTrain, "--steps", "5"}, env);
    ::usleep(300 * 1000);
    const auto t0 = std::chrono::steady_clock::now();
    REQUIRE(::kill(p.pid, sig) == 0);
    const Done d = wait(p);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    INFO(d.out);
    CHECK(WIFSIGNALED(d.status));
    CHECK(WTERMSIG(d.status) == sig);
    CHECK(secs < 2.0);
  }
}

// --- --optim diloco -----------------------------------------------------------------------

namespace {

const std::vector<std::string> kDiloco{"--diloco-sync-every", "8",  "--diloco-fragments", "2",      "--diloco-delay",
                                       "1",                   "--diloco-wire", "int8", "--diloco-error-feedback"};

/// (step, bytes_step, bytes_sent) of every line of a --metrics file.
std::vector<std::tuple<long, double, double>> bytes_of(const fs::path& metrics) {
  std::vector<std::tuple<long, double, double>> out;
  for (const std::string& line : lines_of(slurp(metrics.string()))) {
    const auto j = nlohmann::json::parse(line);
    out.emplace_back(j.at("step").get<long>(), j.at("bytes_step").get<double>(), j.at("bytes_sent").get<double>());
  }
  return out;
}

}  // namespace

TEST_CASE("dopt-train --optim diloco: the loss falls, bytes per step in the metrics and the loss-against-bytes SVG, "
          "against DDP's",
          "[train][diloco]") {
  TempDir dir("dopt-train-diloco", "bytes");
  const Done d = train(args_of("diloco", 3, 200, {"--diloco-sync-every", "20", "--diloco-wire", "int8", "--metrics",
                                                  (dir.path / "d.jsonl").string(), "--svg-bytes",
                                                  (dir.path / "d.svg").string()}));
  INFO(d.out);
  REQUIRE(d.ok());
  CHECK(contains(d.out, "DiLoCo(Adam, sync every 20, 1 fragment(s), delay 0, int8)"));
  CHECK(contains(d.out, "bytes sent per rank:"));
  require_loss_falls(dir.path / "d.jsonl", 200);
  const Done p = train(args_of("ddp", 3, 200, {"--quiet", "--metrics", (dir.path / "p.jsonl").string()}));
  REQUIRE(p.ok());
  const auto db = bytes_of(dir.path / "d.jsonl"), pb = bytes_of(dir.path / "p.jsonl");
  REQUIRE(db.size() == 200);
  REQUIRE(pb.size() == 200);
  // DiLoCo sends only at its syncs (steps 20, 40, ...), DDP every step.
  for (const auto& [step, b, total] : db) CHECK((b > 0) == (step % 20 == 0));
  const double ddp_total = std::get<2>(pb.back()), diloco_total = std::get<2>(db.back());
  INFO("bytes per rank: DDP " << ddp_total << ", DiLoCo " << diloco_total);
  // 20x fewer syncs and int8 instead of float32: about 80x fewer bytes.
  CHECK(ddp_total > 60 * diloco_total);
  const std::string svg = slurp((dir.path / "d.svg").string());
  CHECK(contains(svg, "MB sent per rank"));
  CHECK(contains(svg, "<polyline"));
  // Flags of another mode are refused.
  const Done bad = train(args_of("ddp", 3, 10, {"--diloco-sync-every", "4"}));
  CHECK(WEXITSTATUS(bad.status) == 2);
  CHECK(contains(bad.out, "--diloco-sync-every needs --optim diloco"));
}

TEST_CASE("dopt-train --optim diloco: a run resumed with an average in flight ends bitwise where an uninterrupted "
          "one ends (simulated and under dopt-run)",
          "[train][diloco][multiprocess]") {
  TempDir dir("dopt-train-diloco", "resume");
  const fs::path ck = dir.path / "ck";
  auto with = [&](std::vector<std::string> a) {
    a.insert(a.end(), kDiloco.begin(), kDiloco.end());
    return a;
  };
  const Done a = train(args_of("diloco", 3, 40, with({"--dump-params", (dir.path / "full.st").string(), "--metrics",
                                                      (dir.path / "full.jsonl").string()})));
  INFO(a.out);
  REQUIRE(a.ok());
  // H = 8 / 2 = 4, delay 1: a fragment's average starts after steps 3, 7, ..., 19 and
  // is applied one step later, so the checkpoint at step 19 holds an average in flight.
  const Done b = train(args_of("diloco", 3, 19, with({"--checkpoint-dir", ck.string(), "--metrics",
                                                      (dir.path / "part.jsonl").string()})));
  INFO(b.out);
  REQUIRE(b.ok());
  REQUIRE(fs::exists(ck / "step-00000019" / "checkpoint.json"));
  const Done c = train(args_of("diloco", 3, 40, with({"--checkpoint-dir", ck.string(), "--resume", "--dump-params",
                                                      (dir.path / "resumed.st").string(), "--metrics",
                                                      (dir.path / "part.jsonl").string()})));
  INFO(c.out);
  REQUIRE(c.ok());
  CHECK(contains(c.out, "at step 19"));
  CHECK(slurp((dir.path / "full.st").string()) == slurp((dir.path / "resumed.st").string()));
  CHECK(losses(dir.path / "full.jsonl") == losses(dir.path / "part.jsonl"));
  CHECK(bytes_of(dir.path / "full.jsonl") == bytes_of(dir.path / "part.jsonl"));  // the count continues
  // Processes train exactly like simulated ranks.
  const Done m = train_under_dopt_run(3, args_of("diloco", 3, 40, with({"--dump-params", (dir.path / "mp.st").string()})));
  INFO(m.out);
  REQUIRE(m.ok());
  CHECK(slurp((dir.path / "full.st").string()) == slurp((dir.path / "mp.st").string()));
}

TEST_CASE("dopt-train: a checkpoint that mixes files of two checkpoints is refused on every rank, naming the odd "
          "file and its step",
          "[train][reliability]") {
  // Issue 41: an optimizer shard of step 20 placed in the step-40 checkpoint
  // loaded with exit 0. Every file now carries the checkpoint's identity
  // (step, run, world size, manifest digest); checkpoint.json lists them.
  TempDir dir("dopt-train-mixed", "ck");
  const std::string mode = GENERATE("zero", "ddp");
  const bool processes = GENERATE(false, true);
  INFO(mode << (processes ? ", processes" : ", simulated ranks"));
  const fs::path ck = dir.path / "ck";
  auto run = [&](const std::vector<std::string>& more) {  // 40 steps, or 60 when resuming
    const bool resume = std::find(more.begin(), more.end(), "--resume-from") != more.end();
    const auto a = args_of(mode, 2, resume ? 60 : 40, more);
    return processes ? train_under_dopt_run(2, a) : train(a);
  };
  const Done a = run({"--checkpoint-dir", ck.string(), "--checkpoint-every", "20"});
  INFO(a.out);
  REQUIRE(a.ok());
  const fs::path s20 = ck / "step-00000020", s40 = ck / "step-00000040";
  const auto run_id = nlohmann::json::parse(slurp((s40 / "checkpoint.json").string())).at("run");
  SECTION("an optimizer shard of an earlier step") {
    fs::copy_file(s20 / optim_file(mode, 1, 2), s40 / optim_file(mode, 1, 2), fs::copy_options::overwrite_existing);
    const Done d = run({"--resume-from", s40.string()});
    INFO(d.out);
    CHECK(d.failed());
    CHECK(contains(d.out, (s40 / optim_file(mode, 1, 2)).string() + " holds step 20 of run " +
                              run_id.get<std::string>() + " (2 ranks), but the checkpoint " + s40.string() +
                              " (step 40 of run " + run_id.get<std::string>() +
                              ", 2 ranks): the folder mixes files of different checkpoints"));
    CHECK_FALSE(contains(d.out, "steps in"));
  }
  SECTION("a model file of another run at the same step") {
    const fs::path other = dir.path / "other";
    REQUIRE(run({"--checkpoint-dir", other.string()}).ok());
    fs::copy_file(other / "step-00000040" / model_file(mode, 0, 2), s40 / model_file(mode, 0, 2),
                  fs::copy_options::overwrite_existing);
    const Done d = run({"--resume-from", s40.string()});
    INFO(d.out);
    CHECK(d.failed());
    CHECK(contains(d.out, model_file(mode, 0, 2) + " holds step 40 of run "));
    CHECK(contains(d.out, "the folder mixes files of different checkpoints"));
  }
  SECTION("the unchanged checkpoint resumes") {
    const Done d = run({"--resume-from", s40.string()});
    INFO(d.out);
    CHECK(d.ok());
  }
}

namespace {

/// Edits dir/checkpoint.json.
template <class F>
void edit_checkpoint_json(const fs::path& dir, F&& edit) {
  auto j = nlohmann::json::parse(slurp((dir / "checkpoint.json").string()));
  edit(j);
  std::ofstream((dir / "checkpoint.json").string()) << j.dump(2) << "\n";
}

std::string metadata_of(const fs::path& path, const std::string& key) {
  const auto f = dopt::read_safetensors(path.string());
  auto it = f.metadata.find(key);
  return it == f.metadata.end() ? std::string() : it->second;
}

}  // namespace

TEST_CASE("dopt-train: a current checkpoint.json without its identity is refused, an older one still has its files' "
          "steps checked",
          "[train][multiprocess][reliability]") {
  // Issue 41 review: removing "identity" from checkpoint.json turned the
  // mixed-step check off (the loader took it for an older checkpoint). The
  // Checkpointer's manifest is sealed by its digest; checkpoints of a
  // dopt-train before it ("dopt-train-checkpoint/1" and "/2") are refused,
  // naming the folder and how to go on (docs/dopt-train.md, "Checkpoints").
  TempDir dir("dopt-train-noident", "ck");
  const fs::path ck = dir.path / "ck", s20 = ck / "step-00000020", s40 = ck / "step-00000040";
  auto run = [&](const std::vector<std::string>& more, long steps) {
    return train_under_dopt_run(2, args_of("zero", 2, steps, more));
  };
  const Done a = run({"--checkpoint-dir", ck.string(), "--checkpoint-every", "20"}, 40);
  INFO(a.out);
  REQUIRE(a.ok());
  const auto j40 = nlohmann::json::parse(slurp((s40 / "checkpoint.json").string()));
  CHECK(j40.at("format") == "dopt-checkpoint/1");
  const std::string json40 = (s40 / "checkpoint.json").string();
  SECTION("the manifest's file list emptied in checkpoint.json") {
    edit_checkpoint_json(s40, [](auto& j) { j["files"] = nlohmann::json::array(); });
    fs::copy_file(s20 / optim_file("zero", 1, 2), s40 / optim_file("zero", 1, 2), fs::copy_options::overwrite_existing);
    const Done d = run({"--resume-from", s40.string()}, 60);
    INFO(d.out);
    CHECK(d.failed());
    CHECK(contains(d.out, "dopt-train: error: Checkpointer::load_from [rank 0]: " + json40 +
                              ": the manifest digest does not match its contents"));
    CHECK_FALSE(contains(d.out, "resuming from"));
  }
  SECTION("the format turned back to an older dopt-train's") {
    edit_checkpoint_json(s40, [](auto& j) { j["format"] = "dopt-train-checkpoint/1"; });
    const Done d = run({"--resume-from", s40.string()}, 60);
    INFO(d.out);
    CHECK(d.failed());
    CHECK(contains(d.out, "dopt-train: error: checkpoint: checkpoints of an older dopt-train, which this one does "
                          "not read: " + s40.string() + " (dopt-train-checkpoint/1)"));
    CHECK_FALSE(contains(d.out, "resuming from"));
  }
  SECTION("a genuine checkpoint of an older dopt-train is refused, naming its folder and how to go on") {
    for (const fs::path& s : {s20, s40})
      edit_checkpoint_json(s, [](auto& j) {  // as dopt-train wrote them before the Checkpointer
        j = {{"format", "dopt-train-checkpoint/2"}, {"step", j.at("step")}, {"run", {{"optim", "zero"}}}};
      });
    const std::string both = s20.string() + " (dopt-train-checkpoint/2), " + s40.string() + " (dopt-train-checkpoint/2)";
    for (const auto& more : std::vector<std::vector<std::string>>{{"--resume-from", s40.string()},
                                                                  {"--checkpoint-dir", ck.string(), "--resume"},
                                                                  {"--checkpoint-dir", ck.string()}}) {
      const Done d = run(more, 60);
      INFO(d.out);
      CHECK(d.failed());
      CHECK(contains(d.out, "dopt-train: error: checkpoint: checkpoints of an older dopt-train, which this one does "
                            "not read: " + (more[0] == "--resume-from" ? s40.string() + " (dopt-train-checkpoint/2)"
                                                                       : both)));
      CHECK(contains(d.out, "Finish that run with the dopt-train that wrote them, or start afresh"));
      CHECK_FALSE(contains(d.out, "step 41"));
    }
  }
}

TEST_CASE("dopt-train: two ranks' checkpoint files swapped are refused, naming the file, the rank it holds and the "
          "rank loading it",
          "[train][multiprocess][reliability]") {
  // Issue 41 review: post-local SGD's model files differ per rank, and rank
  // 0's and rank 1's swapped resumed silently. Its parameters are in the rank
  // files; ZeRO's optimizer shards are files of their own.
  const std::string kind = GENERATE("model", "optim");
  INFO(kind << " files swapped");
  const std::string mode = kind == "model" ? "post-local-sgd" : "zero";
  TempDir dir("dopt-train-swap", "ck");
  const fs::path ck = dir.path / "ck", s40 = ck / "step-00000040";
  auto run = [&](const std::vector<std::string>& more, long steps) {
    auto a = args_of(mode, 2, steps, {});
    if (mode == "post-local-sgd") a.insert(a.end(), {"--plsgd-warmup", "5", "--plsgd-period", "100"});
    a.insert(a.end(), more.begin(), more.end());
    return train_under_dopt_run(2, a);
  };
  const Done a = run({"--checkpoint-dir", ck.string(), "--checkpoint-every", "40"}, 40);
  INFO(a.out);
  REQUIRE(a.ok());
  auto file_of = [&](int r) { return s40 / (kind == "model" ? model_file(mode, r, 2) : optim_file(mode, r, 2)); };
  const fs::path f0 = file_of(0), f1 = file_of(1);
  CHECK(metadata_of(f0, "dopt.checkpoint.rank") == "0");
  CHECK(metadata_of(f1, "dopt.checkpoint.rank") == "1");
  if (kind == "model") CHECK(slurp(f0.string()) != slurp(f1.string()));  // the ranks differ: a swap matters
  fs::rename(f0, s40 / "x");
  fs::rename(f1, f0);
  fs::rename(s40 / "x", f1);
  const Done d = run({"--resume-from", s40.string()}, 60);
  INFO(d.out);
  CHECK(d.failed());
  CHECK(contains(d.out, "dopt-train: error: Checkpointer::load_from [rank 0]: " + f0.string() +
                            " was written by rank 1 (dopt.checkpoint.rank), but the checkpoint " + s40.string()));
  CHECK(contains(d.out, "lists it as rank 0's: the ranks' files were swapped or renamed"));
  CHECK_FALSE(contains(d.out, "resuming from"));
}

TEST_CASE("dopt-train: step folders renamed are refused by --resume, and --keep-last keeps by the step a folder holds",
          "[train][multiprocess][reliability]") {
  // Issue 41 review: folder "step-40" holding step 20's checkpoint made
  // --resume go back to step 20, and --keep-last pruned the real newest.
  TempDir dir("dopt-train-renamed", "ck");
  const fs::path ck = dir.path / "ck";
  auto step_dir = [&](int s) {
    char b[32];
    std::snprintf(b, sizeof b, "step-%08d", s);
    return ck / b;
  };
  auto run = [&](const std::vector<std::string>& more, long steps) {
    return train_under_dopt_run(2, args_of("zero", 2, steps, more));
  };
  const Done a = run({"--checkpoint-dir", ck.string(), "--checkpoint-every", "10"}, 40);
  INFO(a.out);
  REQUIRE(a.ok());
  SECTION("two folders' names swapped") {
    fs::rename(step_dir(40), ck / "x");
    fs::rename(step_dir(20), step_dir(40));
    fs::rename(ck / "x", step_dir(20));
    const Done d = run({"--checkpoint-dir", ck.string(), "--resume"}, 60);
    INFO(d.out);
    CHECK(d.failed());
    CHECK(contains(d.out, "dopt-train: error: Checkpointer::load_latest [rank 0]: cannot tell which checkpoint in " +
                              ck.string() + " is the newest: "));
    CHECK(contains(d.out, step_dir(20).string() + " holds step 40 (its checkpoint.json), not the step its name says"));
    CHECK(contains(d.out, step_dir(40).string() + " holds step 20 (its checkpoint.json), not the step its name says"));
    CHECK_FALSE(contains(d.out, "resuming from"));
    const Done e = run({"--resume-from", step_dir(40).string()}, 60);
    INFO(e.out);
    CHECK(e.failed());
    CHECK(contains(e.out, "dopt-train: error: Checkpointer::load_from [rank 0]: " + step_dir(40).string() +
                              " is named for step 40, but its checkpoint.json holds step 20"));
  }
  SECTION("the newest under an old name: never resumed past, never pruned") {
    fs::rename(step_dir(40), step_dir(5));
    const Done d = run({"--checkpoint-dir", ck.string(), "--resume"}, 60);
    INFO(d.out);
    CHECK(d.failed());  // not a silent resume at step 30
    CHECK(contains(d.out, step_dir(5).string() + " holds step 40 (its checkpoint.json)"));
    CHECK_FALSE(contains(d.out, "resuming from"));
    const Done k = run({"--resume-from", step_dir(30).string(), "--checkpoint-dir", ck.string(), "--checkpoint-every",
                        "10", "--keep-last", "2"},
                       70);
    INFO(k.out);
    REQUIRE(k.ok());
    CHECK(contains(k.out, "dopt-train: warning: --keep-last: kept " + step_dir(5).string() +
                              " holds step 40 (its checkpoint.json), not the step its name says"));
    std::vector<std::string> left;
    for (const auto& e : fs::directory_iterator(ck)) left.push_back(e.path().filename().string());
    std::sort(left.begin(), left.end());
    CHECK(left == std::vector<std::string>{"step-00000005", "step-00000060", "step-00000070"});
    CHECK(nlohmann::json::parse(slurp((step_dir(5) / "checkpoint.json").string())).at("step") == 40);
  }
}
