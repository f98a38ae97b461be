// The data-parallel trainer a new user would write on dopt, with none of the
// plumbing written by hand: an MLP on synthetic data (model.hpp), ZeRO(Adam),
// dopt::average_gradients for the gradients' mean over the ranks,
// dopt::DistributedSampler for each rank's share of every batch,
// dopt::all_reduce_metrics for the logged loss, dopt::CoordinatedStop for
// Ctrl-C and SIGTERM, and dopt::Checkpointer: a checkpoint every --every
// steps written in the background, a final one when stopped or done, and
// the newest one loaded at start (at any world size).
//
//   dopt-example-trainer --checkpoint-dir ckpt                  3 simulated ranks in this process
//   dopt-run --nproc-per-node 3 dopt-example-trainer --checkpoint-dir ckpt      3 processes
//
// Run it again with the same folder and it goes on from the newest
// checkpoint (at another world size too: the Checkpointer reshards ZeRO's
// state and rescales the data position). docs/trainer.md, "A whole trainer".
#include <xxhash.h>

#include <CLI/CLI.hpp>

#include <charconv>
#include <cinttypes>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "dopt/actors/distributed.hpp"
#include "dopt/distributed/checkpointer.hpp"
#include "dopt/distributed/trainer.hpp"
#include "dopt/distributed/zero.hpp"
#include "dopt/runtime/distributed_sampler.hpp"
#include "model.hpp"

namespace {

struct Options {
  std::int64_t steps = 200;
  std::string checkpoint_dir = "trainer-checkpoints";
  std::int64_t every = 10;
  int keep_last = 2;
  std::uint64_t seed = 1;
  std::int64_t samples = 96;
  int batch = 12;  // samples per step over all ranks
  int features = 8;
  int hidden = 16;
  double lr = 3e-2;
  int log_every = 20;
  std::int64_t stop_at = 0;
  bool print_digest = false;
  int simulated_ranks = 3;
};

/// What must not change between a run and the run that resumes it.
std::map<std::string, std::string> settings(const Options& o) {
  char lr[32];
  *std::to_chars(lr, lr + sizeof lr - 1, o.lr).ptr = '\0';  // the shortest text that reads back as o.lr
  return {{"seed", std::to_string(o.seed)},        {"samples", std::to_string(o.samples)},
          {"batch", std::to_string(o.batch)},      {"features", std::to_string(o.features)},
          {"hidden", std::to_string(o.hidden)},    {"lr", lr}};
}

/// XXH3-64 of the parameters' bytes, in order: equal digests, equal bits.
std::string digest(const std::vector<dopt::Tensor>& params) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  for (const auto& p : params) XXH3_64bits_update(state, p.data_ptr(), p.nbytes());
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016" PRIx64, static_cast<std::uint64_t>(XXH3_64bits_digest(state)));
  XXH3_freeState(state);
  return hex;
}

void train(dopt::RankContext& ctx, const Options& o) {
  dopt::ProcessGroup& world = ctx.world();
  const int rank = ctx.rank(), ranks = ctx.world_size();
  if (o.batch % ranks != 0 || o.samples % o.batch != 0)
    throw dopt::ValueError("dopt-example-trainer",
                           "--batch " + std::to_string(o.batch) + " must be a multiple of the " +
                               std::to_string(ranks) + " ranks and divide --samples " + std::to_string(o.samples),
                           rank);
  const std::int64_t per_rank = o.batch / ranks;  // this rank's share of every batch

  const trainer::Dataset data(o.samples, o.features, o.seed);
  const trainer::Mlp model(o.features, o.hidden, o.seed);  // the same on every rank
  const std::vector<dopt::Tensor> params = model.parameters();
  dopt::optim::ZeroRedundancyOptimizer optimizer(params, dopt::optim::OptimizerSpec{"Adam", {{"lr", o.lr}}},
                                                 dopt::optim::ZeroOptions{world});
  dopt::DistributedSampler sampler(o.samples, ranks, rank, dopt::DistributedSamplerOptions().seed(o.seed));
  std::int64_t taken = 0;  // samples this rank took of the sampler's epoch
  const std::map<std::string, std::string> wanted = settings(o);
  std::map<std::string, std::string> saved = wanted;

  dopt::CheckpointerOptions ckpt_options;
  ckpt_options.group = world;
  ckpt_options.dir = o.checkpoint_dir;
  ckpt_options.keep_last = o.keep_last;
  dopt::Checkpointer ckpt(ckpt_options);
  ckpt.add_tensors("model", model.named_parameters(), dopt::Placement::replicated);
  ckpt.add_optimizer("optim", optimizer);  // ZeRO: one shard per rank, resharded at load
  ckpt.add_data_position("data", sampler, taken);
  ckpt.add_extras("settings", saved, dopt::Placement::replicated);
  const std::int64_t first = ckpt.load_latest().value_or(0);
  for (const auto& [name, value] : wanted)
    if (saved[name] != value)
      throw dopt::ValueError("dopt-example-trainer",
                             "the checkpoint in " + o.checkpoint_dir + " is of a run with --" + name + " " +
                                 saved[name] + " (this run: " + value + ")",
                             rank);
  if (rank == 0 && first > 0)
    std::printf("resumed at step %" PRId64 " from %s, %d rank(s)\n", first, o.checkpoint_dir.c_str(), ranks);

  dopt::CoordinatedStop stop;  // Ctrl-C or SIGTERM on any rank: every rank stops after the same step
  std::vector<std::int64_t> order = sampler.indices();
  dopt::Future<void> saving;
  std::int64_t step = first;
  bool stopped = false;
  while (step < o.steps && !stopped) {
    if (taken + per_rank > sampler.size()) {  // the epoch is used up: the next one, shuffled anew
      sampler.set_epoch(sampler.epoch() + 1);
      order = sampler.indices();
      taken = 0;
    }
    const std::vector<std::int64_t> batch(order.begin() + taken, order.begin() + taken + per_rank);
    taken += per_rank;
    const double loss = model.forward_backward(data, batch);
    dopt::average_gradients(params, world);  // every gradient becomes its mean over the ranks
    optimizer.step();                        // Adam on this rank's shard, then the shards' broadcasts
    ++step;

    const auto mean = dopt::all_reduce_metrics(world, {{"loss", loss}});
    if (rank == 0 && (step % o.log_every == 0 || step == o.steps))
      std::printf("step %" PRId64 ": loss %.8g\n", step, mean.at("loss")), std::fflush(stdout);
    if (step == o.stop_at && rank == ranks - 1) stop.request_stop();  // --stop-at: as a Ctrl-C on the last rank
    stopped = stop.should_stop(world);                                // the same answer on every rank
    if (step % o.every == 0 || step == o.steps || stopped) {
      if (saving.valid()) saving.get();  // the previous save's error, if it failed
      saving = ckpt.save_async(step);    // returns after the snapshot; written in the background
    }
  }
  ckpt.wait();  // the last save is committed on every rank (or its error thrown)
  if (rank == 0 && stopped)
    std::printf("stopped after step %" PRId64 ": checkpoint %s/step-%08" PRId64 " written\n", step,
                o.checkpoint_dir.c_str(), step);
  if (rank == 0 && o.print_digest) std::printf("digest %s\n", digest(params).c_str());
  world.barrier();  // every rank leaves together
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"dopt example: a data-parallel trainer with ZeRO(Adam), checkpoints and a coordinated stop"};
  app.add_option("--steps", o.steps, "train until this many steps are done")->capture_default_str();
  app.add_option("--checkpoint-dir", o.checkpoint_dir, "the checkpoints' folder; resumes from its newest")
      ->capture_default_str();
  app.add_option("--every", o.every, "save a checkpoint every this many steps")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--keep-last", o.keep_last, "keep this many newest checkpoints (0: all)")->capture_default_str();
  app.add_option("--seed", o.seed, "the data's, the model's and the sampler's seed")->capture_default_str();
  app.add_option("--samples", o.samples, "dataset size")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--batch", o.batch, "samples per step over all ranks")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--features", o.features, "inputs per sample")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--hidden", o.hidden, "hidden units")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--lr", o.lr, "Adam's learning rate")->capture_default_str();
  app.add_option("--log-every", o.log_every, "print the loss every this many steps")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--stop-at", o.stop_at, "stop after this step as if Ctrl-C had been pressed on the last rank");
  app.add_flag("--print-digest", o.print_digest, "print XXH3-64 of the final parameters' bytes");
  app.add_option("--simulated-ranks", o.simulated_ranks, "ranks to simulate when not started by a launcher")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  dopt::RunOptions run;
  run.simulated_ranks = o.simulated_ranks;
  try {
    dopt::run_distributed([&](dopt::RankContext& ctx) { train(ctx, o); }, run);
  } catch (const dopt::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
