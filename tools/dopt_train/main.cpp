// dopt-train: trains a small MLP across ranks with a distributed optimizer
// (docs/dopt-train.md).
//
//   dopt-train                                   # 4 simulated ranks, ZeRO(Adam)
//   dopt-train --optim post-local-sgd --inner sgd --ranks 3
//   dopt-train --optim diloco --diloco-sync-every 50 --diloco-wire int8
//   dopt-run --nproc-per-node 4 dopt-train --optim ddp
//
// The same binary runs its ranks as threads of this process (simulated, the
// default: --ranks) or, started by a launcher (dopt-run, torchrun, mpirun,
// srun), as one rank per process: dopt::run_distributed decides.
//
// Exit status: 0 on success, 2 for bad flags, 1 for any other error (one line
// on stderr: "dopt-train: error: ..."), 130 after Ctrl-C / SIGTERM (with a
// checkpoint when --checkpoint-dir is set).
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "checkpoint.hpp"
#include "finite.hpp"
#include "grow_back.hpp"
#include "memory.hpp"
#include "dopt/actors/distributed.hpp"
#include "dopt/runtime/error.hpp"
#include "dopt/runtime/launch_env.hpp"
#include "dopt/runtime/safetensors.hpp"
#include "dopt/runtime/settings.hpp"
#include "model.hpp"
#include "report.hpp"
#include "signals.hpp"
#include "plan.hpp"
#include "remote.hpp"
#include "strategy.hpp"

namespace fs = std::filesystem;
using namespace dopt_train;
using dopt::Tensor;

namespace {

/// The checkpoints' Checkpointer options: --checkpoint-dir (or, to resume
/// without one, the folder holding --resume-from: it only loads), --keep-last,
/// rank 0's commits reported into `commits`.
dopt::CheckpointerOptions checkpointer_options(dopt::ProcessGroup world, const Options& o, CommitLog& commits) {
  dopt::CheckpointerOptions co;
  co.group = std::move(world);
  co.dir = o.checkpoint_dir;
  if (co.dir.empty()) co.dir = fs::path(o.resume_from).parent_path().string();
  if (co.dir.empty()) co.dir = ".";
  co.keep_last = o.keep_last;
  co.on_commit = [&commits](const dopt::CheckpointCommit& c) { commits.add(c); };
  return co;
}

/// Every rank checks --checkpoint-dir before the first step; all fail
/// together (Checkpointer::check_dir), each naming why.
void check_checkpoint_dir(dopt::Checkpointer& ckpt, int rank) {
  try {
    ckpt.check_dir();
  } catch (const dopt::IOError& e) {
    throw dopt::IOError("checkpoint", "--checkpoint-dir cannot be used: " + e.detail() +
                                          " (checked before the first step)", rank);
  }
}

/// --survive: this rank was cut off or removed from the job (set by the user
/// thread before its StateError leaves run_distributed); main then exits
/// with kExitRemoved, which dopt-run --on-failure continue counts as a lost
/// rank, not as an error (docs/fault-tolerance.md, "Who goes on").
std::atomic<bool> g_removed{false};
constexpr int kExitRemoved = 75;  // sysexits EX_TEMPFAIL: a code programs rarely use for errors

/// --kill-rank: set on the rank that dies (simulated ranks: it throws this).
std::atomic<bool> g_killed{false};
struct RankKilled : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// --kill-rank R --kill-at-step S: rank R dies once S steps are done. A
/// process kills itself (SIGKILL, as a crash would); a simulated rank throws.
void kill_this_rank(int rank, std::int64_t step, bool process) {
  std::fflush(stdout);
  if (process) {
    ::raise(SIGKILL);
    for (;;) ::pause();
  }
  g_killed = true;
  throw RankKilled("rank " + std::to_string(rank) + " killed after step " + std::to_string(step) + " (--kill-rank)");
}

std::string ranks_list(const std::vector<int>& v) {
  std::string s;
  for (int r : v) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}

/// One rank's training loop; `at_step` follows the step it is in (1-based).
void train_rank(dopt::RankContext& ctx, const Plan& plan, std::int64_t& at_step) {
  install_signal_handlers();
  const Options& o = plan.opt;
  const int rank = ctx.rank();
  int world_size = ctx.world_size();  // the survivors' count after a loss (--survive)
  dopt::ProcessGroup world = ctx.world();
  // The rank that writes the metrics and prints the report: the world's
  // rank 0, and after a loss (--survive) the survivors' rank 0, so that a
  // lost rank 0 hands it on (docs/fault-tolerance-tools.md, "dopt-train --survive").
  bool lead = rank == 0;
  // Checkpoints (docs/dopt-train.md, "Checkpoints"); commits and the run's
  // settings outlive the Checkpointer that reports into and reads them.
  CommitLog commits(o.keep_last);
  std::map<std::string, std::string> run_settings = plan.run.to_extras();
  std::optional<dopt::Checkpointer> ckpt;
  if (!o.checkpoint_dir.empty() || !o.resume_from.empty()) ckpt.emplace(checkpointer_options(world, o, commits));
  if (!o.checkpoint_dir.empty()) check_checkpoint_dir(*ckpt, rank);

  Shard shard(o.data, rank, world_size);
  // An elastic job (dopt-run --nnodes MIN:MAX) may start with vacant slots:
  // the world group holds the ranks present, and each keeps its slot's shard.
  if (!plan.replacement) world_size = world.size();
  Mlp model(o.data.input_dim, o.hidden, o.layers, o.data.classes, o.data.seed);
  // A replacement joins the running job: the grown group, its strategy
  // caught up (the parameters, the optimizer state), and the step the
  // members are at (its data position: the shard's batches follow the step).
  std::int64_t start = 0;
  std::unique_ptr<Strategy> strategy;
  if (plan.replacement) {
    g_joining = true;
    start = join_back(world, strategy, plan.strategy, model.params());
    g_joining = false;
    world_size = world.size();
    if (!o.quiet) {
      std::printf("dopt-train: rank %d (replacement, incarnation %lld) rejoined the job at step %lld: parameters, "
                  "optimizer state and step from the members; %d ranks go on (--survive)\n",
                  rank, plan.incarnation, static_cast<long long>(start), world_size);
      std::fflush(stdout);
    }
  } else {
    strategy = make_strategy(plan.strategy, model.params(), world);
  }
  LayerSource* layers = strategy->layer_source();  // ZeRO stage 3: the model keeps no parameters
  if (layers) model.release_params();
  std::int64_t first = 0;  // where this run started (a replacement: where the members' did)
  std::string resumed_from;  // the checkpoint's folder, when resuming
  std::string saved_ranks;   // the rank count the checkpoint was written by (JSON), when resuming
  if (ckpt) {
    // The settings first: a load checks them before the model's shapes.
    ckpt->add_extras("run", run_settings, dopt::Placement::replicated,
                     [&plan, &saved_ranks](const std::map<std::string, std::string>& saved, const std::string& folder) {
                       check_compatible(saved, plan.run, folder);
                       if (auto it = saved.find("ranks"); it != saved.end()) saved_ranks = it->second;
                     });
    strategy->add_to(*ckpt, model.named_params());
    if (!o.resume_from.empty()) {
      first = ckpt->load_from(o.resume_from);
      resumed_from = o.resume_from;
    } else if (o.resume) {
      if (const auto step = ckpt->load_latest()) {
        first = *step;
        resumed_from = ckpt->folder(first);
      } else if (o.resume_mode == "required") {
        throw dopt::IOError("resume", "--resume=required but there is no complete checkpoint in " + o.checkpoint_dir);
      } else if (rank == 0) {
        std::printf("dopt-train: note: no checkpoint in %s yet: starting at step 0\n", o.checkpoint_dir.c_str());
        std::fflush(stdout);
      }
    }
    // The load replaced the settings with the checkpoint's: with --elastic
    // the next checkpoints are this run's rank count's.
    if (plan.run.any_ranks) run_settings["ranks"] = plan.run.to_extras().at("ranks");
    if (!resumed_from.empty()) strategy->resumed(first);
    start = first;
  }
  const bool tty = ::isatty(1) != 0;
  std::optional<MetricsWriter> metrics;
  std::vector<std::pair<std::int64_t, double>> history;
  if (lead) {
    if (!o.metrics.empty()) metrics.emplace(o.metrics, first);
    if (!o.quiet) {
      std::printf("dopt-train: MLP %s (%s parameters), %d %s, %s lr %g, batch %d per rank\n",
                  model.describe().c_str(), thousands(model.numel()).c_str(), world_size,
                  plan.launched ? (world_size == 1 ? "process" : "processes") : "simulated ranks",
                  strategy->describe().c_str(), strategy->lr(), o.batch);
      std::printf("data: %s synthetic samples (teacher network, seed %llu), about %s per rank\n",
                  thousands(o.data.samples).c_str(), static_cast<unsigned long long>(o.data.seed),
                  thousands(shard.size()).c_str());
      if (!resumed_from.empty())
        std::printf("resuming from %s at step %lld\n", resumed_from.c_str(), static_cast<long long>(first));
      if (!resumed_from.empty() && saved_ranks != std::to_string(world_size))
        std::printf("dopt-train: note: the checkpoint was written by %s ranks, this run has %d (--elastic): the "
                    "optimizer state is resharded, the data are dealt over %d ranks from step %lld on\n",
                    saved_ranks.c_str(), world_size, world_size, static_cast<long long>(first));
      std::fflush(stdout);
    }
  }
  const std::int64_t log_every = o.log_every > 0 ? o.log_every : std::max<std::int64_t>(1, o.steps / 20);
  Progress progress(first, o.steps, tty, o.quiet || !lead, log_every);
  // --survive: every rank keeps the steps' records, so that a rank that
  // takes the lead over can write what the lost one had not.
  std::vector<StepRecord> records;

  bool params_nonfinite = false;  // after the latest step, on some rank (--nonfinite warn)
  // A collective of the ranks: snapshots the state and returns; rank 0's
  // background writer commits it (reported through `commits`).
  auto save_checkpoint = [&](std::int64_t step) {
    if (params_nonfinite) {
      if (lead)
        progress.note("dopt-train: warning: no checkpoint at step " + std::to_string(step) +
                      ": the parameters hold non-finite values");
      return;
    }
    ckpt->wait();  // the previous save: committed, or its error thrown on every rank
    if (metrics) metrics->flush();
    ckpt->save_async(step);
  };

  // loss, accuracy, stop, non-finite ranks, memory (memory.hpp): summed over the ranks.
  Tensor stats = Tensor::zeros({6}, dopt::DType::float64);
  // Bytes sent: continued from the kept metrics lines when resuming.
  double bytes_before = 0;
  std::vector<std::pair<double, double>> bytes_history;
  std::vector<std::pair<std::int64_t, double>> memory_history;  // (step, memory per rank), this run's
  if (metrics && !metrics->bytes_history().empty()) bytes_before = metrics->bytes_history().back().first;
  std::uint64_t last_bytes = 0;
  // Bytes the strategies before a grow-back sent (the one after starts at 0).
  std::uint64_t bytes_carried = 0;
  // --survive, growing back: the lost ranks' replacements that rejoined, and before which step.
  std::vector<std::string> rejoins;
  bool may_grow = true;  // false once the plane refused (grow_back)
  std::int64_t saved_at = -1, interrupted_at = -1;
  bool warned_nonfinite = false;
  const auto t0 = std::chrono::steady_clock::now();
  double first_loss = NAN, last_loss = NAN, first_acc = NAN, last_acc = NAN;
  // This rank becomes the lead after step `done` (the lead, rank `was`, was lost): the
  // metrics file keeps what the lost lead wrote and gets the rest from
  // this rank's records; the progress and the report go on here.
  auto take_lead = [&](std::int64_t done, int was) {
    progress = Progress(done, o.steps, tty, o.quiet, log_every);
    if (!o.metrics.empty()) {
      metrics.emplace(o.metrics, done);
      const std::int64_t kept = metrics->history().empty() ? first : metrics->history().back().first;
      for (const StepRecord& rec : records)
        if (rec.step > kept) metrics->write(rec);
    }
    if (!o.quiet)
      progress.note("dopt-train: rank " + std::to_string(was) + " was lost; rank " + std::to_string(rank) +
                    " leads from here: metrics, progress and the report (--survive)");
  };
  for (std::int64_t s = start; s < o.steps; ++s) {
    at_step = s + 1;
    // --survive under dopt-run --on-failure replace: while the group is
    // smaller than the job, the members ask at every step boundary whether
    // replacements wait; all get the same count, grow together and rebuild
    // the strategy over the grown group, which catches the newcomers up. The
    // lead stays: rank 0 cannot be replaced, so the lowest member stays the
    // grown group's rank 0.
    // (A newcomer's first boundary is the one the members grew at already.)
    if (o.survive && may_grow && world.size() < plan.world_size && strategy->can_grow() &&
        !(plan.replacement && s == start)) {
      const std::uint64_t sent = strategy->bytes_sent();
      if (const std::vector<int> joined = grow_back(world, strategy, plan.strategy, model.params(), s, may_grow);
          !joined.empty()) {
        bytes_carried += sent;
        last_bytes = 0;
        world_size = world.size();
        rejoins.push_back("rank(s) " + ranks_list(joined) + " rejoined before step " + std::to_string(s + 1));
        if (lead && !o.quiet)
          progress.note("dopt-train: " + rejoins.back() + " (replacement; ZeRO catch-up: parameters, optimizer "
                        "state, step); " + std::to_string(world_size) + " ranks go on (--survive)");
      }
    }
    if (!plan.replacement && rank == o.kill_rank && s == o.kill_at_step) kill_this_rank(rank, s, plan.launched);
    const std::vector<int> idx = shard.batch(s, o.batch);
    BatchResult r;
    try {
      r = model.forward_backward(shard, idx, [&](const Tensor& p) { strategy->grad_ready(p); }, layers);
      strategy->finish_step();
    } catch (const dopt::PeerLostError& e) {
      if (o.survive && !rejoins.empty()) throw no_survival_after_rejoin(rank, s, rejoins.back(), e);
      throw;
    }
    // --survive: the ranks the strategy lost and recovered from in this step
    // (the step was completed over the survivors).
    std::vector<int> lost = strategy->take_lost();
    const std::uint64_t now_bytes = strategy->bytes_sent();
    const double step_bytes = double(now_bytes - last_bytes);
    last_bytes = now_bytes;

    // The loss and accuracy of this step over all ranks (for the report only).
    double* st = stats.data<double>();
    st[0] = r.loss;
    st[1] = double(r.correct) / o.batch;
    if (lead && o.interrupt_at_step == s + 1) std::raise(SIGINT);  // tests: a Ctrl-C at a known step
    st[2] = g_signal.load() != 0 ? 1 : 0;  // summed: every rank sees the same decision
    // A non-finite loss or parameter: every rank learns how many ranks have one.
    std::string mine;
    if (!std::isfinite(r.loss)) mine = "the loss is " + std::string(std::isnan(r.loss) ? "NaN" : "inf");
    else if (layers) mine = nonfinite_parameter(strategy->local_params(), strategy->local_param_names());
    else mine = nonfinite_parameter(model.params(), model.names());
    st[3] = mine.empty() ? 0 : 1;
    const RankMemory mem = measure_memory(model, *strategy);
    st[4] = mem.total();
    st[5] = mem.peak_rss;
    const std::vector<double> mine_stats(st, st + 6);
    for (;;) {
      try {
        world.all_reduce(stats);
        break;
      } catch (const dopt::PeerLostError& e) {
        if (!o.survive) throw;
        if (!rejoins.empty()) throw no_survival_after_rejoin(rank, s, rejoins.back(), e);
        // The survivors take a world of their own; when the strategy did not
        // see the loss in this step (it came after finish_step), it recovers
        // too, between steps. Then this step's report again over them.
        const std::vector<int> before = world.ranks();
        dopt::ShrinkResult sr = world.shrink();
        world = sr.group;
        world_size = world.size();
        if (!lead && world.rank() == 0) {
          lead = true;
          take_lead(s, before.front());
        }
        if (lost.empty()) {
          strategy->recover();
          lost = strategy->take_lost();
        }
        if (lost.empty())
          for (int k : sr.lost) lost.push_back(before[static_cast<std::size_t>(k)]);
        std::copy(mine_stats.begin(), mine_stats.end(), stats.data<double>());
      }
    }
    if (!lost.empty() && world.rank() == 0 && !o.quiet)
      progress.note("dopt-train: rank(s) " + ranks_list(lost) + " lost during step " + std::to_string(s + 1) + "; " +
                    std::to_string(world_size) + " ranks go on (--survive)");
    const bool stop = stats.data<double>()[2] > 0;
    const int nonfinite_ranks = static_cast<int>(stats.data<double>()[3]);
    params_nonfinite = nonfinite_ranks > 0;
    if (nonfinite_ranks > 0) {
      const std::string what = "step " + std::to_string(s + 1) + ": non-finite values on " +
                               std::to_string(nonfinite_ranks) + " of " + std::to_string(world_size) + " ranks" +
                               (mine.empty() ? "" : " (here: " + mine + ")");
      if (o.nonfinite == "error") {
        progress.finish();
        throw dopt::ValueError("train", what + "; stopped without writing a checkpoint of it" +
                                                 (saved_at > 0 ? " (the last one is step " + std::to_string(saved_at) + ")"
                                                               : std::string()) +
                                                 ". Lower --lr, or pass --nonfinite warn to keep going", rank);
      }
      if (lead && !warned_nonfinite)
        progress.note("dopt-train: warning: " + what + "; going on (--nonfinite warn), without checkpoints while "
                      "the parameters are not finite");
      warned_nonfinite = true;
    }

    if (s == first) {  // optimizer state exists from the first step on
      Tensor mine = Tensor::from_vector(std::vector<double>{double(strategy->state_bytes()),
                                                            double(strategy->owned_numel()), mem.params, mem.grads,
                                                            mem.peak_rss});
      std::vector<Tensor> all;
      for (int k = 0; k < world_size; ++k) all.push_back(Tensor::zeros({5}, dopt::DType::float64));
      world.all_gather(all, mine);
      if (lead && !o.quiet) {
        double total = 0;
        std::printf("optimizer state per rank after the first step:\n");
        for (int k = 0; k < world_size; ++k) {
          const double b = all[static_cast<std::size_t>(k)].at(0), n = all[static_cast<std::size_t>(k)].at(1);
          total += b;
          std::printf("  rank %d: %s (state of %s of %s parameters)\n", k, format_bytes(b).c_str(),
                      thousands(static_cast<std::int64_t>(n)).c_str(), thousands(model.numel()).c_str());
        }
        if (o.optim == "zero")
          std::printf("  total %s over %d ranks; without ZeRO every rank would hold all %s\n",
                      format_bytes(total).c_str(), world_size, format_bytes(total).c_str());
        else
          std::printf("  total %s over %d ranks (each holds a full copy)\n", format_bytes(total).c_str(), world_size);
        std::printf("memory per rank after the first step (parameters + gradients + optimizer state; peak RSS):\n");
        for (int k = 0; k < world_size; ++k) {
          const Tensor& a = all[static_cast<std::size_t>(k)];
          std::printf("  rank %d: %s + %s + %s = %s; peak RSS %s\n", k, format_bytes(a.at(2)).c_str(),
                      format_bytes(a.at(3)).c_str(), format_bytes(a.at(0)).c_str(),
                      format_bytes(a.at(2) + a.at(3) + a.at(0)).c_str(), format_bytes(a.at(4)).c_str());
        }
        std::fflush(stdout);
      }
    }

    {
      StepRecord rec;
      rec.step = s + 1;
      rec.loss = stats.data<double>()[0] / world_size;
      rec.accuracy = stats.data<double>()[1] / world_size;
      rec.lr = strategy->lr();
      rec.time_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      rec.steps_per_s = rec.time_s > 0 ? double(s + 1 - first) / rec.time_s : 0;
      rec.bytes_step = step_bytes;
      rec.bytes_sent = bytes_before + double(bytes_carried + now_bytes);
      rec.mem_bytes = stats.data<double>()[4] / world_size;
      rec.peak_rss = stats.data<double>()[5] / world_size;
      memory_history.emplace_back(rec.step, rec.mem_bytes);
      bytes_history.emplace_back(rec.bytes_sent, rec.loss);
      if (s == first) first_loss = rec.loss, first_acc = rec.accuracy;
      last_loss = rec.loss, last_acc = rec.accuracy;
      history.emplace_back(rec.step, rec.loss);
      if (o.survive) records.push_back(rec);
      if (lead && metrics) metrics->write(rec);
      if (lead) progress.update(rec);
      if (lead)
        for (const std::string& line : commits.take()) progress.note(line);
    }
    if (o.checkpoint_every > 0 && (s + 1) % o.checkpoint_every == 0) save_checkpoint(s + 1), saved_at = s + 1;
    if (stop) {
      interrupted_at = s + 1;
      if (!o.checkpoint_dir.empty() && saved_at != s + 1) save_checkpoint(s + 1), saved_at = s + 1;
      break;
    }
  }
  if (interrupted_at < 0 && !o.checkpoint_dir.empty() && o.steps > first && saved_at != o.steps)
    save_checkpoint(o.steps);
  if (ckpt) ckpt->wait();  // the last save is committed (or its error thrown) before the report
  if (lead)
    for (const std::string& line : commits.take()) progress.note(line);
  progress.finish();
  if (!o.dump_params.empty())
    dump_params(world, layers ? strategy->full_params() : model.params(), model.names(), o.dump_params,
                interrupted_at >= 0 ? interrupted_at : std::max(first, o.steps));
  if (interrupted_at >= 0) g_exit_code = 130;

  // The final report, printed by the lead.
  auto report = [&] {
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (metrics) metrics->flush();
  if (!o.svg.empty()) {
    // With --metrics the curve also has the steps before a resume; without, this run's only.
    std::vector<std::pair<std::int64_t, double>> points = metrics ? metrics->history() : history;
    write_loss_svg(o.svg, points,
                   "dopt-train: " + strategy->describe() + ", " + std::to_string(world_size) + " ranks, MLP " +
                       model.describe(),
                   metrics ? metrics->memory_history() : memory_history);
  }
  if (!o.svg_bytes.empty()) {
    std::vector<std::pair<double, double>> points = metrics ? metrics->bytes_history() : bytes_history;
    for (auto& [b, l] : points) b /= 1e6;
    write_curve_svg(o.svg_bytes, points,
                    "dopt-train: " + strategy->describe() + ", " + std::to_string(world_size) + " ranks",
                    "MB sent per rank");
  }
  if (interrupted_at >= 0) {
    std::printf("dopt-train: interrupted after step %lld of %lld; %s\n", static_cast<long long>(interrupted_at),
                static_cast<long long>(o.steps),
                o.checkpoint_dir.empty() ? "no --checkpoint-dir, so nothing was saved"
                                         : ("checkpoint saved: continue with --checkpoint-dir " + o.checkpoint_dir +
                                            " --resume")
                                               .c_str());
  } else if (o.steps <= first) {
    std::printf("dopt-train: the checkpoint is at step %lld, --steps is %lld: nothing to train\n",
                static_cast<long long>(first), static_cast<long long>(o.steps));
  } else {
    std::printf("dopt-train: %lld steps in %.1f s (%.1f steps/s); loss %.4f -> %.4f, accuracy %.3f -> %.3f\n",
                static_cast<long long>(o.steps - first), secs, double(o.steps - first) / secs, first_loss, last_loss,
                first_acc, last_acc);
  }
  // Tests (--kill-at-step equal to --steps): the lead dies while it prints the report.
  if (!plan.replacement && rank == o.kill_rank && o.kill_at_step == o.steps)
    kill_this_rank(rank, o.steps, plan.launched);
  for (const std::string& r : rejoins)
    std::printf("dopt-train: %s (--survive); the run ended with %d ranks\n", r.c_str(), world_size);
  if (!o.metrics.empty()) std::printf("metrics: %s\n", o.metrics.c_str());
  if (!o.svg.empty()) std::printf("loss curve: %s\n", o.svg.c_str());
  if (!o.svg_bytes.empty()) std::printf("loss against bytes sent: %s\n", o.svg_bytes.c_str());
  if (o.steps > first && interrupted_at < 0)
    std::printf("bytes sent per rank: %s in %lld steps (%s per step)\n",
                format_bytes(double(bytes_carried + last_bytes)).c_str(), static_cast<long long>(o.steps - first),
                format_bytes(double(bytes_carried + last_bytes) / double(o.steps - first)).c_str());
  if (!o.dump_params.empty()) std::printf("parameters: %s\n", o.dump_params.c_str());
  std::fflush(stdout);
  };
  // Every rank waits at a final barrier until the lead printed the report,
  // so that no rank reports success before it is printed. --survive: when
  // the lead is lost before the barrier, the survivors shrink and the new
  // lead prints it (perhaps a second time); without, the barrier's
  // PeerLostError (naming the lead) fails the rank.
  at_step = o.steps + 1;
  if (lead) report();
  if (!o.survive) {
    world.barrier();
    return;
  }
  if (!plan.replacement && rank == o.kill_rank && o.kill_at_step == o.steps && !lead)
    kill_this_rank(rank, o.steps, plan.launched);
  for (;;) {
    try {
      world.barrier();
      return;
    } catch (const dopt::PeerLostError&) {
      const std::vector<int> before = world.ranks();
      world = world.shrink().group;
      world_size = world.size();
      if (!lead && world.rank() == 0) {
        lead = true;
        take_lead(interrupted_at >= 0 ? interrupted_at : std::max(first, o.steps), before.front());
        report();
      }
    }
  }
}

int usage_error(const std::string& msg) {
  std::fprintf(stderr, "dopt-train: %s\nRun with --help for more information.\n", msg.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"dopt-train: trains a small MLP across ranks with a distributed optimizer.\n"
               "Simulated ranks in this process by default; under dopt-run, one rank per process."};
  app.get_formatter()->column_width(34);
  std::vector<std::string> inner_names;
  for (const auto& [k, v] : kInner) inner_names.push_back(k);
  app.add_option("--optim", o.optim, "Distributed optimizer: zero | post-local-sgd | ddp | diloco | remote")
      ->check(CLI::IsMember(available_modes()))
      ->capture_default_str();
  app.add_option("--inner", o.inner, "Local optimizer: adam | adamw | sgd | adagrad | rmsprop | adamax | adadelta | rprop")
      ->check(CLI::IsMember(inner_names, CLI::ignore_case))
      ->capture_default_str();
  app.add_option("--ranks", o.ranks, "Simulated ranks (ignored under a launcher)")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  app.add_option("--steps", o.steps, "Train until this many steps are done")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--lr", o.lr, "Learning rate (default: one that suits --inner)")->check(CLI::PositiveNumber);
  app.add_option("--batch", o.batch, "Samples per rank per step")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  app.add_option("--hidden", o.hidden, "Units of each hidden layer")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--layers", o.layers, "Hidden layers")->check(CLI::Range(1, 64))->capture_default_str();
  app.add_option("--samples", o.data.samples, "Size of the synthetic data set")
      ->check(CLI::Range(1, 1 << 24))
      ->capture_default_str();
  app.add_option("--seed", o.data.seed, "Seed of the data, the teacher and the initial model")->capture_default_str();
  app.add_option("--checkpoint-every", o.checkpoint_every, "Save a checkpoint every K steps (needs --checkpoint-dir)")
      ->check(CLI::PositiveNumber);
  app.add_option("--checkpoint-dir", o.checkpoint_dir, "Folder of the checkpoints (also gets one at the end)");
  app.add_flag("--resume{auto}", o.resume_mode,
               "Resume from the latest checkpoint in --checkpoint-dir, or start at step 0 when there is none yet; "
               "--resume=required: there must be one")
      ->check(CLI::IsMember({"auto", "required"}));
  app.add_option("--keep-last", o.keep_last, "Keep only the newest N checkpoints (default: all)")
      ->check(CLI::PositiveNumber);
  app.add_option("--nonfinite", o.nonfinite,
                 "A NaN/inf loss or parameter: error (stop, exit 1) or warn (go on, no checkpoints while not finite)")
      ->check(CLI::IsMember({"error", "warn"}))
      ->capture_default_str();
  app.add_option("--resume-from", o.resume_from, "Resume from this checkpoint folder (DIR/step-XXXXXXXX)");
  app.add_flag("--elastic", o.elastic,
               "Resume a checkpoint written by another number of ranks (torchrun --nnodes MIN:MAX): the optimizer "
               "state is resharded and the data are dealt over this run's ranks from the checkpoint's step on");
  app.add_option("--metrics", o.metrics,
                 "Write one JSON line per step here (step, loss, accuracy, lr, steps_per_s, time_s, bytes_step, bytes_sent)");
  app.add_option("--svg", o.svg, "Draw the loss curve into this SVG file");
  app.add_option("--svg-bytes", o.svg_bytes, "Draw the loss against the bytes sent per rank into this SVG file");
  app.add_option("--dump-params", o.dump_params, "Write every rank's final parameters here (safetensors)");
  app.add_option("--log-every", o.log_every, "Plain progress line every N steps when not on a terminal")
      ->check(CLI::PositiveNumber);
  app.add_flag("--quiet", o.quiet, "Print only the summary");
  app.add_flag("--survive", o.survive,
               "Go on with the survivors when a rank is lost (--optim zero: redundancy 1; ddp); run the processes "
               "under dopt-run --on-failure continue, or replace (--optim zero: the replacement rejoins)");
  app.add_option("--survive-buddies", o.survive_buddies,
                 "--survive with --optim zero: how a rank's buddy keeps its shard: step (steps a copy; buddies on "
                 "other hosts where there are any) or host_memory (the shard in shared memory the buddy maps; "
                 "ranks on one host, survives processes, not hosts)")
      ->check(CLI::IsMember({"step", "host_memory"}))
      ->capture_default_str();
  app.add_option("--zero-stage", o.zero_stage,
                 "--optim zero: 1 (every rank gets every averaged gradient), 2 (each rank keeps only the "
                 "gradients of the parameters it owns) or 3 (each rank keeps only its shard of every layer, "
                 "gathered for the layer's forward and backward); bit for bit stage 1's result; docs/zero-stage2-3.md")
      ->check(CLI::IsMember({1, 2, 3}))
      ->capture_default_str();
  app.add_option("--kill-rank", o.kill_rank, "Testing: this rank dies (rank 0 too: with --survive the lowest survivor then leads, without it the job fails), SIGKILL as a process, ...")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--kill-at-step", o.kill_at_step, "... once this many steps are done (equal to --steps: while the lead prints the final report)")->check(CLI::PositiveNumber);
  app.add_option("--interrupt-at-step", o.interrupt_at_step, "Testing: act as if Ctrl-C came at step N")
      ->group("");  // hidden
  app.add_option("--plsgd-warmup", o.plsgd_warmup, "post-local-sgd: steps of global gradient averaging first")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--plsgd-period", o.plsgd_period, "post-local-sgd: average the parameters every N steps after warm-up")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--plsgd-local-group", o.plsgd_local_group,
                 "post-local-sgd: after warm-up average gradients in blocks of K ranks (1: not at all)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--diloco-sync-every", o.diloco_sync_every,
                 "diloco: inner steps between two synchronisations of a fragment (H)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--diloco-fragments", o.diloco_fragments, "diloco: fragments (Streaming DiLoCo), staggered")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--diloco-delay", o.diloco_delay, "diloco: inner steps a fragment's average overlaps (tau)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--diloco-alpha", o.diloco_alpha, "diloco: fragment_update_alpha (0: take the global value)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--diloco-outer-lr", o.diloco_outer_lr, "diloco: outer SGD learning rate")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--diloco-outer-momentum", o.diloco_outer_momentum,
                 "diloco: outer SGD Nesterov momentum (0: plain SGD)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--diloco-wire", o.diloco_wire, "diloco: wire format: float32 | bfloat16 | float16 | int8 | int4")
      ->check(CLI::IsMember({"float32", "bfloat16", "float16", "int8", "int4"}))
      ->capture_default_str();
  app.add_flag("--diloco-error-feedback", o.diloco_error_feedback,
               "diloco: carry the quantization error to the next sync (int8, int4, bfloat16, float16)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  for (char& c : o.inner) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  o.resume = app.count("--resume") > 0;
  if (o.resume && !o.resume_from.empty()) return usage_error("--resume and --resume-from exclude each other");
  if (o.resume && o.checkpoint_dir.empty()) return usage_error("--resume needs --checkpoint-dir");
  if (o.checkpoint_every > 0 && o.checkpoint_dir.empty()) return usage_error("--checkpoint-every needs --checkpoint-dir");
  if (o.keep_last > 0 && o.checkpoint_dir.empty()) return usage_error("--keep-last needs --checkpoint-dir");
  if (o.elastic && !o.resume && o.resume_from.empty()) return usage_error("--elastic needs --resume or --resume-from");
  for (const char* f : {"--plsgd-warmup", "--plsgd-period", "--plsgd-local-group"})
    if (o.optim != "post-local-sgd" && app.count(f)) return usage_error(std::string(f) + " needs --optim post-local-sgd");
  for (const char* f : {"--diloco-sync-every", "--diloco-fragments", "--diloco-delay", "--diloco-alpha",
                        "--diloco-outer-lr", "--diloco-outer-momentum", "--diloco-wire", "--diloco-error-feedback"})
    if (o.optim != "diloco" && app.count(f)) return usage_error(std::string(f) + " needs --optim diloco");
  if (o.optim == "diloco") {
    if (o.diloco_sync_every % o.diloco_fragments != 0)
      return usage_error("--diloco-sync-every " + std::to_string(o.diloco_sync_every) +
                         " must be a multiple of --diloco-fragments " + std::to_string(o.diloco_fragments));
    if (o.diloco_delay >= o.diloco_sync_every / o.diloco_fragments)
      return usage_error("--diloco-delay must be smaller than --diloco-sync-every / --diloco-fragments (" +
                         std::to_string(o.diloco_sync_every / o.diloco_fragments) + ")");
    if (o.diloco_error_feedback && o.diloco_wire == "float32")
      return usage_error("--diloco-error-feedback needs a compressed --diloco-wire (bfloat16, float16, int8, int4)");
  }

  if ((app.count("--kill-rank") > 0) != (app.count("--kill-at-step") > 0))
    return usage_error("--kill-rank and --kill-at-step go together");
  if (o.survive_buddies != "step" && (!o.survive || o.optim != "zero"))
    return usage_error("--survive-buddies " + o.survive_buddies + " needs --survive and --optim zero");
  if (o.zero_stage != 1 && o.optim != "zero")
    return usage_error("--zero-stage " + std::to_string(o.zero_stage) + " needs --optim zero");
  if (o.zero_stage == 3 && o.survive)
    return usage_error("--zero-stage 3 does not go with --survive yet (stage 3 has no buddies: redundancy is "
                       "refused; stages 1 and 2 survive)");
  if (o.zero_stage == 2 && o.survive)
    return usage_error("--zero-stage 2 does not go with --survive (the buddies of redundancy 1 step other ranks' "
                       "shards from their averaged gradients, which stage 2 does not keep)");
  if (o.survive) {
    if (!mode_survives(o.optim))
      return usage_error("--survive needs --optim zero or ddp (" + o.optim + " cannot go on over the survivors yet; "
                         "see docs/fault-tolerance-tools.md)");
    if (!o.checkpoint_dir.empty() || !o.resume_from.empty())
      return usage_error("--survive does not take checkpoints yet (the survivors' shard and file names would change)");
    if (o.kill_rank >= 0 && o.kill_at_step > o.steps)
      return usage_error("--kill-at-step must not be larger than --steps");
  }
  if (o.optim == "remote" && (!o.checkpoint_dir.empty() || !o.resume_from.empty()))
    return usage_error("checkpoints are not available with --optim remote: the optimizer state lives on the "
                       "parameter owners inside DistributedOptimizer, which has no state_dict");
  if (std::string why; !mode_available(o.optim, &why)) {
    std::fprintf(stderr, "dopt-train: error: %s\n", why.c_str());
    return 1;
  }
  try {
    Plan plan;
    plan.opt = o;
    const std::optional<dopt::LaunchEnv> env = dopt::launch_env_from_environment();
    plan.launched = env.has_value();
    plan.world_size = env ? env->world_size : o.ranks;
    const int per_rank = o.data.samples / plan.world_size;
    if (o.batch > per_rank)
      return usage_error("--batch " + std::to_string(o.batch) + " is larger than each rank's share of the data (" +
                         std::to_string(per_rank) + " of --samples " + std::to_string(o.data.samples) + " over " +
                         std::to_string(plan.world_size) + " ranks)");
    if (o.optim == "post-local-sgd" && plan.world_size % o.plsgd_local_group != 0)
      return usage_error("--plsgd-local-group " + std::to_string(o.plsgd_local_group) + " does not divide the " +
                         std::to_string(plan.world_size) + " ranks");
    if (env && app.count("--ranks") && o.ranks != env->world_size && env->rank == 0)
      std::fprintf(stderr, "dopt-train: note: started by a launcher with %d processes; --ranks %d is ignored\n",
                   env->world_size, o.ranks);

    plan.strategy = strategy_config(o);
    // A replacement of a lost rank (dopt-run --on-failure replace) joins the
    // running job; only a strategy with a catch-up can take it.
    plan.replacement = plan.launched && dopt::settings::integer("DOPT_REPLACES").has_value();
    plan.incarnation = dopt::settings::integer("DOPT_INCARNATION").value_or(0);
    if (std::string why; plan.replacement && !config_grows(plan.strategy, &why)) return usage_error(why);
    // Under dopt-run --on-failure replace every rank refuses such a run at
    // the start, before any training, not only a replacement after a loss.
    if (std::string why; plan.launched && dopt::settings::text("DOPT_ON_FAILURE").value_or("") == "replace" &&
                         !config_grows(plan.strategy, &why))
      return usage_error(why + " (refused at the start: dopt-run --on-failure replace, DOPT_ON_FAILURE=replace)");
    if (o.kill_rank >= plan.world_size)
      return usage_error("--kill-rank " + std::to_string(o.kill_rank) + " is not a rank of the " +
                         std::to_string(plan.world_size) + " ranks");
    plan.run = run_info(o, plan.strategy, plan.world_size);

    refuse_older_checkpoints(o.checkpoint_dir, o.resume_from);

    if (o.optim == "remote") {
#ifdef DOPT_TRAIN_HAVE_REMOTE
      run_remote(plan);  // over dopt::rpc
#endif
    } else {
      dopt::RunOptions ro;
      ro.simulated_ranks = o.ranks;
      // A node that joins later, or a replacement, must run with the same flags (rank 0 refuses it otherwise).
      ro.init.compatibility = join_compatibility(o, plan.run);
      dopt::run_distributed([&](dopt::RankContext& ctx) {
        std::int64_t step = 0;
        try {
          train_rank(ctx, plan, step);
        } catch (const dopt::StateError& e) {
          // --survive: this side may not go on (cut off from the majority, or
          // removed when it came back): it stops, naming the step, with exit
          // code kExitRemoved (dopt-run --on-failure continue counts it lost).
          const std::string d = e.detail();
          if (e.op() != "ProcessGroup.shrink" ||
              (d.rfind("this rank is cut off", 0) != 0 && d.rfind("this rank cannot go on", 0) != 0))
            throw;
          g_removed = true;
          throw dopt::StateError("dopt-train --survive",
                                 (step > o.steps ? std::string("after the last step") : "step " + std::to_string(step)) +
                                     ": " + d,
                                 ctx.rank());
        }
      }, ro);
    }
  } catch (const std::exception& e) {
    std::fflush(stdout);
    // Simulated ranks: the rank --kill-rank killed is rethrown once the
    // survivors finished; that is the run going as asked.
    if (o.survive && g_killed.load() && std::string(e.what()).find("(--kill-rank)") != std::string::npos) {
      std::printf("dopt-train: %s; the others finished (--survive)\n", e.what());
      return g_exit_code.load();
    }
    std::fprintf(stderr, "dopt-train: error: %s\n", e.what());
    return g_removed.load() || came_after_job_ended(e) ? kExitRemoved : 1;
  }
  return g_exit_code.load();
}
